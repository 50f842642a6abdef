"""vit-serve under load: images/s and p50/p99 latency at concurrency 1, 8 and 32, against the bare batched forward of
the same model on the same machine.

    python bench/serve.py --ckpt checkpoints/digits/version_0/last.ckpt
    python bench/serve.py --model cifar      # a random-weights model of configs/cifar10.yaml's size (speed only)

The server is started as a user starts it (`python -m vit.commands.serve`, loopback, default batching, plus
--server-args), the clients are threads sending real image files (the built-in digits as 32x32 PNGs, or --images) as
multipart uploads over keep-alive connections. The reference is the bare batched forward of the same model in this
process while the server idles: batches of --max-batch-size already-normalised images, inference mode. Both are
measured in --rounds interleaved rounds (bare, then each concurrency level); a round's ratio is its served images/s
over its own bare images/s, and the table gives the median round and the spread, because this machine's speed drifts
by 10-20% within minutes. Writes bench/serve.json.
"""

import argparse
import http.client
import io
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vit.evaluation.image_features import features_of  # noqa: E402
from vit.evaluation.unknown import rejection_record  # noqa: E402
from vit.model.checkpoint import load_model  # noqa: E402
from vit.model.config import ViTConfig  # noqa: E402
from vit.model.vision_transformer import VisionTransformer  # noqa: E402

# Architectures to bench without a trained checkpoint (speed does not depend on the weights).
MODELS = {
    "mnist": dict(img_size=32, patch_size=8, embed_dim=96, depth=4, num_heads=3),  # the MNIST folder's plan
    "cifar": dict(img_size=32, patch_size=4, embed_dim=384, depth=7, num_heads=6),  # configs/cifar10.yaml
}


def random_checkpoint(name: str, folder: Path) -> Path:
    """Random weights with a rejection record as fit makes one (statistics of its features on random images), so
    that the server does its per-batch unknown check as it does for a trained checkpoint."""
    cfg = ViTConfig(num_classes=10, **MODELS[name])
    model = VisionTransformer(cfg).eval()
    hp = {"arch": cfg.to_dict(), "class_names": [str(i) for i in range(10)], "mean": [0.5] * 3, "std": [0.25] * 3}
    x = torch.randn(256, 3, cfg.img_size, cfg.img_size)
    outputs = features_of(model, [(x, torch.arange(256) % 10)], torch.device("cpu"))
    unknown = rejection_record(outputs, outputs, hp.class_names)
    path = folder / f"{name}.ckpt"
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save({"state_dict": state, "hyper_parameters": hp, "unknown": unknown}, path)
    return path


def digit_files(folder: Path, n: int = 64) -> list[bytes]:
    from vit.data.digits import DigitsDataModule

    images = DigitsDataModule().memory["val"][0][:n].permute(0, 2, 3, 1).numpy()
    out = []
    for img in images:
        buffer = io.BytesIO()
        Image.fromarray(img).save(buffer, format="PNG")
        out.append(buffer.getvalue())
    return out


def start(ckpt: Path, port: int, extra: list[str]) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "vit.commands.serve", "--ckpt", str(ckpt), "--port", str(port), *extra],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit("vit-serve did not start within 120 s")


def load(port: int, files: list[bytes], concurrency: int, requests: int) -> dict:
    """`requests` uploads from `concurrency` threads, each on its own keep-alive connection."""
    boundary = uuid.uuid4().hex
    bodies = [
        (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="x.png"\r\n'
         "Content-Type: image/png\r\n\r\n").encode() + f + f"\r\n--{boundary}--\r\n".encode()
        for f in files
    ]  # fmt: skip
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}

    def client(worker: int) -> tuple[list[float], int, list[int]]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        latencies, failed, batches = [], 0, []
        for i in range(worker, requests, concurrency):
            t = time.perf_counter()
            try:
                conn.request("POST", "/predict?topk=5", body=bodies[i % len(bodies)], headers=headers)
                response = conn.getresponse()
                answer = json.loads(response.read())
                if response.status != 200:
                    failed += 1
                else:
                    batches.append(answer["batch"])
            except (OSError, http.client.HTTPException, ValueError):
                failed += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            latencies.append(time.perf_counter() - t)
        conn.close()
        return latencies, failed, batches

    t = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(client, range(concurrency)))
    wall = time.perf_counter() - t
    latencies = sorted(x for r in results for x in r[0])
    batches = [b for r in results for b in r[2]]
    return {
        "concurrency": concurrency,
        "requests": requests,
        "failed": sum(r[1] for r in results),
        "images_per_s": requests / wall,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "mean_batch": statistics.mean(batches) if batches else 0.0,
    }


def bare_forward(model, x: torch.Tensor, seconds: float = 4.0) -> float:
    """Images/s of model(x) on a normalised batch, inference mode, in this process, steps until `seconds` passed."""
    with torch.inference_mode():
        model(x)
        steps, t = 0, time.perf_counter()
        while time.perf_counter() - t < seconds:
            model(x)
            steps += 1
        return x.shape[0] * steps / (time.perf_counter() - t)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", help="a checkpoint to serve (default: a random-weights --model)")
    ap.add_argument("--model", choices=sorted(MODELS), default="mnist")
    ap.add_argument("--images", help="a folder of image files to send (default: the built-in digits as PNGs)")
    ap.add_argument("--requests", type=int, default=300, help="requests per concurrency level and round")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of bare forward and load (median)")
    ap.add_argument("--server-args", default="", help="more vit-serve arguments, e.g. '--api-servers 1'")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--out", default=str(ROOT / "bench" / "serve.json"))
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp())
    ckpt = Path(args.ckpt) if args.ckpt else random_checkpoint(args.model, tmp)
    if args.images:
        files = [p.read_bytes() for p in sorted(Path(args.images).rglob("*")) if p.is_file()][:256]
    else:
        files = digit_files(tmp)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model, hp = load_model(ckpt)
    x = torch.randn(args.max_batch_size, hp.in_chans, hp.img_size, hp.img_size)
    proc = start(ckpt, port, ["--max-batch-size", str(args.max_batch_size), *args.server_args.split()])
    rounds = []  # per round: the bare images/s and one row per concurrency level
    try:
        load(port, files, 8, 64)  # warm-up: the worker's first batches, connections
        for _ in range(args.rounds):
            bare = bare_forward(model, x)
            rounds.append((bare, [load(port, files, c, args.requests) for c in args.concurrency]))
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    bares = [bare for bare, _ in rounds]
    spread = f"{min(bares):.0f}-{max(bares):.0f}"
    print(f"model {ckpt.name}, server args {args.server_args!r}; bare batched forward (batch {args.max_batch_size}): "
          f"median {statistics.median(bares):.0f} images/s over {args.rounds} rounds ({spread})")  # fmt: skip
    header = ("concurrency", "images/s", "x bare", "(spread)", "p50 ms", "p99 ms", "batch", "failed")
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (11, 9, 7, 11, 7, 7, 6, 6))))
    rows = []
    for i, c in enumerate(args.concurrency):
        per_round = [row[i] | {"ratio_to_bare": row[i]["images_per_s"] / bare} for bare, row in rounds]
        ratios = sorted(r["ratio_to_bare"] for r in per_round)
        median = sorted(per_round, key=lambda r: r["ratio_to_bare"])[len(per_round) // 2]  # the median round
        rows.append(median | {"ratio_min": ratios[0], "ratio_max": ratios[-1], "rounds": per_round})
        print(
            f"{c:>11} {median['images_per_s']:>9.0f} {median['ratio_to_bare']:>7.2f} "
            f"{f'({ratios[0]:.2f}-{ratios[-1]:.2f})':>11} {median['p50_ms']:>7.1f} {median['p99_ms']:>7.1f} "
            f"{median['mean_batch']:>6.1f} {sum(r['failed'] for r in per_round):>6}"
        )
    summary = {"model": str(ckpt.name), "server_args": args.server_args, "bare_images_per_s": bares, "rows": rows}
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
