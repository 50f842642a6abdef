"""Predict CLI throughput against the bare model forward at the same batch size (goal: >= 0.8x).

    python bench/predict_speed.py [--ckpt PATH] [--images 1024] [--batch-size 64] [--rounds 5]

Both are timed in this process, interleaved (A B A B ...), median of the rounds. The CLI side decodes real PNG files
written to a temporary folder (DataLoader workers), preprocesses and classifies them; the bare side runs the model
on ready tensors. Without --ckpt, a model of the size of configs/cifar10.yaml (384 wide, 7 deep, patch 4) with
random weights is used.
"""

import argparse
import statistics
import tempfile
import time

import numpy as np
import torch
from PIL import Image

from vit.deployment.predict import pick_device, predict
from vit.model.checkpoint import load_model
from vit.model.vision_transformer import VisionTransformer


def measure(
    ckpt: str | None, n_images: int, batch_size: int, rounds: int, num_workers: int | None = None, device: str = "auto"
) -> dict:
    device = str(pick_device(device))
    if ckpt:
        model, hp = load_model(ckpt)
    else:
        model = VisionTransformer(img_size=32, patch_size=4, embed_dim=384, depth=7, num_heads=6).eval()
        hp = {"img_size": 32, "mean": [0.5] * 3, "std": [0.5] * 3, "class_names": None}
    model = model.to(device)
    size = hp.img_size
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i in range(n_images):
            Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(f"{tmp}/{i}.png")
            paths.append(f"{tmp}/{i}.png")
        batches = torch.randn(n_images, 3, size, size, device=device).split(batch_size)

        def bare() -> float:
            t = time.perf_counter()
            with torch.inference_mode():
                for x in batches:
                    model(x)
            if device.startswith("cuda"):
                torch.cuda.synchronize()  # the benchmark's clock
            return n_images / (time.perf_counter() - t)

        def cli() -> float:
            t = time.perf_counter()
            predict(
                model, paths, hp, topk=5, batch_size=batch_size, device=device, num_workers=num_workers, progress=False
            )
            return n_images / (time.perf_counter() - t)

        bare(), cli()  # warm-up
        a, b = [], []
        for _ in range(rounds):
            a.append(bare())
            b.append(cli())
    return {
        "bare_img_s": statistics.median(a),
        "predict_img_s": statistics.median(b),
        "ratio": statistics.median(y / x for x, y in zip(a, b)),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt")
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--num-workers", type=int, default=None)
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = ap.parse_args()
    r = measure(args.ckpt, args.images, args.batch_size, args.rounds, args.num_workers, args.device)
    print(
        f"bare forward {r['bare_img_s']:.0f} img/s, predict {r['predict_img_s']:.0f} img/s, "
        f"ratio {r['ratio']:.2f} (goal >= 0.8)"
    )
