"""vit-serve under load: images/s and p50/p99 latency at concurrency 1, 8 and 32, against the bare batched forward of
the same model on the same machine.

    python bench/serve.py --ckpt checkpoints/digits/version_0/last.ckpt
    python bench/serve.py --model cifar      # a random-weights model of configs/cifar10.yaml's size (speed only)

The server is started as a user starts it (`python -m vit.commands.serve`, loopback, default batching), the clients
are threads sending real image files (the built-in digits as 32x32 PNGs, or --images) as multipart uploads over
keep-alive connections. The bare forward is timed in this process while the server idles: batches of
--max-batch-size already-normalised images, inference mode, the median of 5 rounds. Writes bench/serve.json.
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

from vit.model.checkpoint import load_model  # noqa: E402
from vit.model.config import ViTConfig  # noqa: E402
from vit.model.vision_transformer import VisionTransformer  # noqa: E402

# Architectures to bench without a trained checkpoint (speed does not depend on the weights).
MODELS = {
    "mnist": dict(img_size=32, patch_size=8, embed_dim=96, depth=4, num_heads=3),  # the MNIST folder's plan
    "cifar": dict(img_size=32, patch_size=4, embed_dim=384, depth=7, num_heads=6),  # configs/cifar10.yaml
}


def random_checkpoint(name: str, folder: Path) -> Path:
    cfg = ViTConfig(num_classes=10, **MODELS[name])
    model = VisionTransformer(cfg)
    hp = {"arch": cfg.to_dict(), "class_names": [str(i) for i in range(10)], "mean": [0.5] * 3, "std": [0.25] * 3}
    path = folder / f"{name}.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}, "hyper_parameters": hp}, path)
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


def bare_forward(ckpt: Path, batch: int, rounds: int = 5, steps: int = 20) -> float:
    """Images/s of model(x) on normalised batches, inference mode, this process: median of `rounds`."""
    model, hp = load_model(ckpt)
    x = torch.randn(batch, hp["in_chans"], hp["img_size"], hp["img_size"])
    speeds = []
    with torch.inference_mode():
        model(x)
        for _ in range(rounds):
            t = time.perf_counter()
            for _ in range(steps):
                model(x)
            speeds.append(batch * steps / (time.perf_counter() - t))
    return statistics.median(speeds)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", help="a checkpoint to serve (default: a random-weights --model)")
    ap.add_argument("--model", choices=sorted(MODELS), default="mnist")
    ap.add_argument("--images", help="a folder of image files to send (default: the built-in digits as PNGs)")
    ap.add_argument("--requests", type=int, default=600, help="requests per concurrency level")
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
    bare = bare_forward(ckpt, args.max_batch_size)
    proc = start(ckpt, port, ["--max-batch-size", str(args.max_batch_size)])
    try:
        load(port, files, 8, 64)  # warm-up: the worker's first batches, connections
        rows = [load(port, files, c, args.requests) for c in args.concurrency]
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    bare_after = bare_forward(ckpt, args.max_batch_size)
    reference = statistics.mean([bare, bare_after])
    print(f"model {ckpt.name}; bare batched forward (batch {args.max_batch_size}): {reference:.0f} images/s "
          f"(before {bare:.0f}, after {bare_after:.0f})")  # fmt: skip
    print(f"{'concurrency':>11} {'images/s':>9} {'x bare':>7} {'p50 ms':>7} {'p99 ms':>7} {'batch':>6} {'failed':>6}")
    for r in rows:
        r["ratio_to_bare"] = r["images_per_s"] / reference
        print(
            f"{r['concurrency']:>11} {r['images_per_s']:>9.0f} {r['ratio_to_bare']:>7.2f} {r['p50_ms']:>7.1f} "
            f"{r['p99_ms']:>7.1f} {r['mean_batch']:>6.1f} {r['failed']:>6}"
        )
    Path(args.out).write_text(
        json.dumps({"model": str(ckpt.name), "bare_images_per_s": reference, "rows": rows}, indent=2) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
