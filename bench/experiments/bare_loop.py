"""A bare training loop on an image folder, for the time-to-accuracy comparison (docs/recipes.md): what a person
writes in 40 lines with timm and PyTorch, a fixed recipe, no planning.

    python bench/experiments/bare_loop.py DIR --budget 900 --out bench/experiments/bare_loop.json

DIR/train/<class>/*, DIR/val/<class>/*. Decodes every file once (PIL, grayscale to RGB), trains timm's
VisionTransformer (96 wide, 4 blocks, patch 7 at 28 px, average pooling), AdamW 1e-3, weight decay 0.05, cosine over
--epochs, batch 128, random crop with 2 px padding and flips, and evaluates after every epoch; stops at --budget
seconds from the process start. Writes [{"epoch", "seconds", "val_acc"}] (seconds since the process started).
"""

import argparse
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import timm
import torch
import torch.nn.functional as F
from PIL import Image


def since_start() -> float:
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime - ticks / os.sysconf("SC_CLK_TCK")


def load(folder: Path, size: int):
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    xs, ys = [], []
    for i, c in enumerate(classes):
        for f in sorted((folder / c).iterdir()):
            xs.append(np.asarray(Image.open(f).convert("RGB").resize((size, size))))
            ys.append(i)
    return torch.from_numpy(np.stack(xs)).permute(0, 3, 1, 2).contiguous(), torch.tensor(ys), len(classes)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root")
    ap.add_argument("--budget", type=float, default=900.0)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--size", type=int, default=28)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/experiments/bare_loop.json")
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    train_x, train_y, n_classes = load(Path(args.root) / "train", args.size)
    val_x, val_y, _ = load(Path(args.root) / "val", args.size)
    mean = train_x.float().mean((0, 2, 3), keepdim=True) / 255
    std = train_x.float().std((0, 2, 3), keepdim=True) / 255
    model = timm.models.VisionTransformer(
        img_size=args.size, patch_size=args.size // 4, embed_dim=96, depth=4, num_heads=3, num_classes=n_classes,
        global_pool="avg", class_token=False,
    )  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    steps = args.epochs * (len(train_x) // 128)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    log = []
    for epoch in range(args.epochs):
        model.train()
        perm = torch.randperm(len(train_x))
        for i in range(0, len(perm) - 127, 128):
            idx = perm[i : i + 128]
            x = F.pad(train_x[idx].float() / 255, (2, 2, 2, 2))
            dx, dy = np.random.randint(0, 5, 2)
            x = x[..., dy : dy + args.size, dx : dx + args.size]
            x = torch.where(torch.rand(len(x), 1, 1, 1) < 0.5, x.flip(-1), x)
            loss = F.cross_entropy(model((x - mean) / std), train_y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        model.eval()
        with torch.no_grad():
            pred = torch.cat([model((val_x[i : i + 512].float() / 255 - mean) / std).argmax(-1)
                              for i in range(0, len(val_x), 512)])  # fmt: skip
        log.append({"epoch": epoch, "seconds": since_start(), "val_acc": (pred == val_y).float().mean().item()})
        print(log[-1], flush=True)
        if since_start() > args.budget:
            break
    Path(args.out).write_text(json.dumps(log, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
