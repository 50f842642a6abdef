"""An (images, labels) .npz written as a torchvision MNIST-family dataset (root/<Class>/raw/*-idx?-ubyte), split as
bench/data/to_folder.py splits it (the same seeded permutation, the first VAL images held out as the "t10k"
split): `torch/mnist` or `torch/fashion_mnist` then holds the same images as the folder, for comparing the two paths.

python bench/experiments/npz_to_idx.py ../shared/data/mnist10k.npz /tmp/torch_mnist MNIST --val 2000
python bench/experiments/npz_to_idx.py fmnist60k.npz /tmp/torch_fmnist FashionMNIST --val 10000   # held out of the training set
"""

import argparse
import struct
from pathlib import Path

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("npz")
    p.add_argument("root")
    p.add_argument("cls", help="torchvision's class name: MNIST, FashionMNIST, KMNIST")
    p.add_argument("--val", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    d = np.load(a.npz)
    x, y = d["images"], d["labels"].astype(np.uint8)
    order = np.random.default_rng(a.seed).permutation(len(y))
    raw = Path(a.root, a.cls, "raw")
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, idx in (("t10k", order[: a.val]), ("train", order[a.val :])):
        n, h, w = len(idx), *x.shape[1:]
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, n, h, w) + x[idx].tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, n) + y[idx].tobytes())
    print(f"{len(y) - a.val} train and {a.val} t10k images under {raw}")


if __name__ == "__main__":
    main()
