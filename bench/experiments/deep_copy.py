"""A 12-bit copy of a folder of 8-bit images, as a 12-bit camera writes it: every PNG's values times 16 in a 16-bit
grey PNG (0..4080 of 0..65535: the same picture, no information added). Training on the copy and on the original
at one budget and seed tells whether the 16-bit path keeps the levels (an 8-bit detour, value / 65535 * 255, keeps
16 of them).

    python bench/data/to_folder.py ../shared/data/mnist10k.npz mnist_png --val 2000
    python bench/experiments/deep_copy.py mnist_png mnist12
    for s in 0 1 2; do for d in mnist_png mnist12; do
        python train.py fit --data.root $d --budget 1min --seed_everything $s; done; done
"""

import argparse
from pathlib import Path

import numpy as np
from PIL import Image


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("src")
    p.add_argument("dst")
    a = p.parse_args()
    src, dst = Path(a.src), Path(a.dst)
    files = sorted(src.rglob("*.png"))
    for f in files:
        out = dst / f.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        grey = np.asarray(Image.open(f).convert("L"), dtype=np.uint16)
        Image.fromarray(grey * 16).save(out)  # mode I;16
    print(f"{len(files)} images -> {dst} (12 bits in 16-bit PNGs)")


if __name__ == "__main__":
    main()
