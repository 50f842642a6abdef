"""Speed levers on this machine: one training step (AdamW, batch 128, random data) of candidate models in fp32 and
bf16 autocast, eager and torch.compile; images/s (median of 6 steps after 2) and the first step's seconds (compile).

    python bench/speed_levers.py

docs/recipes.md ("At 60,000 images", speed levers) quotes its output.
"""

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
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


def main() -> int:
    torch.manual_seed(0)
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
