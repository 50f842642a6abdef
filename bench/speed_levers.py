"""Speed levers on this machine: one training step (AdamW, batch 128, random data) of candidate models in fp32 and
bf16 autocast, eager and torch.compile; images/s (median of 6 steps after 2) and the first step's seconds (compile).
With --hybrid: the hybrid's CNN stem (Lite0 to stride 16, 192 x 4 blocks, batch 32, fp32) in channels_last against
PyTorch's default NCHW, both models in one process, interleaved, the ratio of each round's speeds, median of 5 rounds.

    python bench/speed_levers.py [--hybrid]

docs/recipes.md ("At 60,000 images", speed levers; "Real photos from ImageNet weights") quotes its output.
"""

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from vit.model import stems
from vit.model.config import ViTConfig
from vit.model.vision_transformer import VisionTransformer

CANDIDATES = {
    "64x3 p8@32 (16t)": dict(img_size=32, patch_size=8, embed_dim=64, depth=3, num_heads=2),
    "128x6 p8@32 (16t)": dict(img_size=32, patch_size=8, embed_dim=128, depth=6, num_heads=4),
    "192x6 p7@28 (16t)": dict(img_size=28, patch_size=7, embed_dim=192, depth=6, num_heads=3),
    "96x4 p4@28 (49t)": dict(img_size=28, patch_size=4, embed_dim=96, depth=4, num_heads=3),
    "128x6 p4@28 (49t)": dict(img_size=28, patch_size=4, embed_dim=128, depth=6, num_heads=4),
}


def step_speed(cfg: dict, batch: int, bf16: bool, compiled: bool, steps: int = 6) -> tuple[float, float]:
    """(training images/s, seconds of the first step) for one configuration."""
    model = VisionTransformer(ViTConfig(**cfg, num_classes=10, in_chans=3))
    if compiled:
        model.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(batch, 3, cfg["img_size"], cfg["img_size"])
    y = torch.randint(0, 10, (batch,))
    times, first = [], 0.0
    for i in range(steps + 2):
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i == 0:
            first = time.perf_counter() - t
        if i >= 2:
            times.append(time.perf_counter() - t)
    return batch / statistics.median(times), first


def train_speed(model, opt, x: torch.Tensor, y: torch.Tensor, steps: int) -> float:
    """Training images/s of `steps` steps on the batch (x, y)."""
    t = time.perf_counter()
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return steps * len(x) / (time.perf_counter() - t)


def hybrid_ratios(sides=(96, 128, 160), batch: int = 32, rounds: int = 5, steps: int = 4) -> None:
    """Training images/s of the hybrid with its stem in channels_last and in NCHW (stems.CHANNELS_LAST, read when a
    stem is built), and their ratio: the two alternate, round by round, so that a noisy machine slows both."""
    for side in sides:
        cfg = ViTConfig(img_size=side, patch_size=16, in_chans=3, num_classes=2, embed_dim=192, depth=4, num_heads=3,
                        stem="tf_efficientnet_lite0", drop_path_rate=0.05)  # fmt: skip
        runs = {}
        for layout in (True, False):
            stems.CHANNELS_LAST = layout
            model = VisionTransformer(cfg)
            runs[layout] = (model, torch.optim.AdamW(model.parameters(), lr=5e-4))
        stems.CHANNELS_LAST = True
        x, y = torch.randn(batch, 3, side, side), torch.randint(0, 2, (batch,))
        for run in runs.values():
            train_speed(*run, x, y, 2)  # warm-up: oneDNN's kernels chosen, weights reordered
        speeds = {True: [], False: []}
        for _ in range(rounds):
            for layout, run in runs.items():
                speeds[layout].append(train_speed(*run, x, y, steps))
        ratio = statistics.median(a / b for a, b in zip(speeds[True], speeds[False]))
        nhwc, nchw = statistics.median(speeds[True]), statistics.median(speeds[False])
        print(f"hybrid {side:3d} px  channels_last {nhwc:5.1f} img/s  NCHW {nchw:5.1f} img/s  ratio {ratio:.2f}x")


def main() -> int:
    torch.manual_seed(0)
    if "--hybrid" in sys.argv[1:]:
        hybrid_ratios()
        return 0
    for name, cfg in CANDIDATES.items():
        for bf16 in (False, True):
            for compiled in (False, True):
                speed, first = step_speed(cfg, 128, bf16, compiled)
                print(
                    f"{name:20s} bf16={bf16!s:5} compile={compiled!s:5} {speed:7.0f} img/s  first step {first:5.1f} s"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
