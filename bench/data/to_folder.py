"""Write an (images, labels) .npz as root/train/<class>/*.png and root/val/<class>/*.png (seeded split)."""

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

p = argparse.ArgumentParser()
p.add_argument("npz")
p.add_argument("out")
p.add_argument("--val", type=int, default=2000, help="images held out for val/")
p.add_argument("--seed", type=int, default=0)
a = p.parse_args()
d = np.load(a.npz)
x, y = d["images"], d["labels"]
order = np.random.default_rng(a.seed).permutation(len(y))
for n, i in enumerate(order):
    folder = Path(a.out, "val" if n < a.val else "train", str(int(y[i])))
    folder.mkdir(parents=True, exist_ok=True)
    Image.fromarray(x[i]).save(folder / f"{i:05d}.png")
print(f"{len(y) - a.val} train and {a.val} val images under {a.out}")
