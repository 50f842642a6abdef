"""`vit-serve`: a checkpoint behind HTTP (LitServe), with a page to try it at `/`.

    vit-serve --ckpt checkpoints/digits/version_0/last.ckpt              # http://127.0.0.1:8000/
    vit-serve --onnx vit-int8.onnx                                       # an exported model on the CPU (no maps)
    curl -F file=@digit.png 'http://127.0.0.1:8000/predict?topk=3&map=relevance'

POST /predict takes an image (multipart field `file`, or the raw bytes with an image/* content type) and answers the
top-k classes with probabilities; `map=relevance` (or `rollout`) adds the map of the predicted class as a base64 PNG.
GET /health, GET /info (classes, image size, architecture, the checkpoint's file name). Concurrent requests are
batched on the device (`--max-batch-size`, `--batch-timeout`); `--api-servers` HTTP processes read and decode them.
Bad input gets a 4xx JSON `{"error": ...}` and the server goes on. Only PNG, JPEG, WEBP, BMP, GIF and TIFF are
opened (415 otherwise); a request whose Host header names no served host gets a 400 (DNS rebinding); SIGTERM and
SIGINT stop every process the server started.
"""

import argparse
import ipaddress
import logging
import os
import signal
import sys
from importlib import resources

import torch

from vit.commands.command_line import device_flag, model_flags
from vit.deployment.onnx_model import OnnxError, load_onnx
from vit.deployment.predict import pick_device
from vit.model.checkpoint import CheckpointError, load_model

PAGE = "index.html"  # vit/static/index.html, shipped in the package
API_SERVERS = 2  # HTTP processes: decoding in one while the other waits on the queue (docs/serving.md, "Throughput")
# Model workers on a CPU, the cores split between them: one computes while the other collects its batch and answers,
# and no forward waits at an OpenMP barrier on a thread that an HTTP process preempted. CIFAR-size model, 32 clients,
# 2 cores: 1.10x the bare forward against 0.92x with one 2-thread worker, ahead in each of 6 interleaved rounds
# (docs/serving.md, "Throughput").
CPU_WORKERS = 2
# Seconds a stop waits for an API server to finish its requests and end before killing it: LitServe's 30, for each
# API server in turn, let a stop whose HTTP process did not end take a minute.
SHUTDOWN_WAIT_S = 5


def build_parser() -> argparse.ArgumentParser:
    """The command line (the README's commands are checked against it)."""
    ap = argparse.ArgumentParser(
        prog="vit-serve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    model_flags(
        ap, onnx_help="a model exported by vit-export (int8 or not) with FILE.json beside it, on the CPU; no maps"
    )
    ap.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on: one interface's address, or 0.0.0.0 / :: for all (default 127.0.0.1; any other "
        "than loopback is warned about: the server is then reachable from other machines)",
    )
    ap.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a name clients may use in the Host header besides the bound address and localhost (repeatable)",
    )
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max-batch-size", type=int, default=32, help="most requests in one forward (default 32)")
    ap.add_argument(
        "--batch-timeout", type=float, default=0.01, help="seconds to wait for a batch to fill (default 0.01)"
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=None,
        help=f"model workers per device (default: {CPU_WORKERS} on a CPU, sharing its cores; 1 on a GPU)",
    )
    ap.add_argument(
        "--api-servers",
        type=int,
        default=API_SERVERS,
        help=f"HTTP processes that read, check and decode uploads (default {API_SERVERS})",
    )
    device_flag(ap)
    ap.add_argument("--max-body-mb", type=float, default=20.0, help="largest request body in MB (default 20)")
    ap.add_argument(
        "--max-pixels",
        type=int,
        default=16_000_000,
        help="largest image, width x height after JPEG's draft scaling, checked before decoding (default 16 million)",
    )
    ap.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    return ap


def build_server(args: argparse.Namespace):
    """The LitServer for parsed arguments: model worker, HTTP checks, the page at /. Raises CheckpointError."""
    import litserve as ls
    from fastapi.responses import HTMLResponse

    from vit.deployment.serve import HostCheck, ImageRequests, LeaveTerminalGroup, ViTAPI, allowed_hosts, server_info

    source = args.onnx or args.ckpt
    # refuses a pickle-carrying or broken checkpoint (an ONNX file without its sidecar) before anything starts
    model, record = load_onnx(args.onnx) if args.onnx else load_model(args.ckpt)
    device = "cpu" if args.onnx else pick_device(args.device).type
    workers, threads = worker_layout(device, args.workers, torch.get_num_threads())
    if device == "cpu":
        # The model worker shares the cores with the HTTP processes. OpenMP's threads otherwise spin between the ops
        # of a forward, taking the cores that HTTP needs: 3.4 CPU-ms per request in the worker of the small model
        # at 32 clients, 0.9 ms with passive waiting (docs/serving.md, "Throughput"). The worker is a spawned process,
        # so it reads this when its OpenMP starts; a user's own setting wins.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    api = ViTAPI(
        source,
        max_batch_size=args.max_batch_size,
        batch_timeout=args.batch_timeout,
        onnx=bool(args.onnx),
        threads=threads,
    )
    checks = dict(
        path="/predict",
        img_size=record.img_size,
        in_chans=record.in_chans,
        num_classes=model.num_classes,
        max_bytes=int(args.max_body_mb * 2**20),
        max_pixels=args.max_pixels,
    )
    server = ls.LitServer(
        api,
        accelerator=device,
        devices=1,
        workers_per_device=workers,
        model_metadata=server_info(source, record),
        middlewares=[
            (LeaveTerminalGroup, {"launcher": os.getpid()}),
            (ImageRequests, checks),
            (HostCheck, {"allowed": allowed_hosts(args.host, args.allowed_host)}),
        ],
    )
    # LitServer has no argument for it: uvicorn's graceful-shutdown timeout and the join of each API server on a stop
    # read this attribute (tests/deployment/test_serve.py fails when LitServe stops reading it)
    server.uvicorn_graceful_timeout = SHUTDOWN_WAIT_S
    page = resources.files("vit").joinpath("static", PAGE).read_text()
    # LitServe answers GET / with "litserve running": the page takes its place
    server.app.router.routes = [r for r in server.app.router.routes if getattr(r, "path", None) != "/"]
    server.app.add_api_route("/", lambda: HTMLResponse(page), methods=["GET"], include_in_schema=False)
    return server


def worker_layout(device: str, workers: int | None, cores: int) -> tuple[int, int | None]:
    """(model workers, intra-op threads of each) for a device: on a CPU, `workers` (default CPU_WORKERS, at most one
    per core) share the `cores` that torch would use; on a GPU one worker unless asked, threads left alone (None)."""
    if device != "cpu":
        return workers or 1, None
    workers = workers or max(1, min(CPU_WORKERS, cores))
    return workers, max(1, cores // workers)


def is_loopback(host: str) -> bool:
    """Whether an address (or 'localhost') is this machine's loopback."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_LAUNCHER = os.getpid()  # the process that runs main(); LitServe forks its API servers from it


def _interrupt(signum, frame) -> None:
    if os.getpid() != _LAUNCHER:  # a forked API server inherited this handler: end as SIGTERM ends a process
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if (
        min(args.max_batch_size, args.workers or 1, args.api_servers) < 1
        or args.batch_timeout < 0
        or args.max_body_mb <= 0
    ):
        build_parser().error(
            "--max-batch-size, --workers and --api-servers must be >= 1, --batch-timeout >= 0, --max-body-mb > 0"
        )
    try:
        server = build_server(args)
    except (CheckpointError, OnnxError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not is_loopback(args.host):
        print(
            f"vit-serve: warning: listening on {args.host}: reachable from other machines, with no authentication",
            file=sys.stderr,
        )
    logging.getLogger("litserve").setLevel(args.log_level.upper())
    # A service manager or `kill` sends SIGTERM to this process alone: ending as on Ctrl-C lets LitServe stop the
    # API-server and inference processes it started (they kept the port, orphaned, when SIGTERM ended us alone).
    signal.signal(signal.SIGTERM, _interrupt)
    # Ctrl-C stops it even where SIGINT came in ignored: a shell starts a background job (`vit-serve ... &`, CI's
    # scripts) with SIGINT ignored, and Python then leaves it so; the launcher sat out the test's Ctrl-C for 30 s
    signal.signal(signal.SIGINT, _interrupt)
    print(f"vit-serve: http://{args.host}:{args.port}/ (POST /predict, GET /health, GET /info)", flush=True)
    try:
        server.run(
            host=args.host,
            port=args.port,
            num_api_servers=args.api_servers,
            generate_client_file=False,
            log_level=args.log_level,
        )
    except KeyboardInterrupt:  # a second Ctrl-C during the shutdown
        pass
    finally:
        from vit.deployment.processes import stop_children

        stop_children(SHUTDOWN_WAIT_S)  # any API server that LitServe's own stop did not know of
    print("vit-serve: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
