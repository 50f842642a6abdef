"""Fashion-MNIST's official 60,000 training images as an .npz for to_folder.py (the 10,000 test images are left out).

    apt-get install -y dataset-fashion-mnist        # Debian's package: the four idx files, gzipped
    python bench/data/fashion_mnist.py fmnist60k.npz
    python bench/data/to_folder.py fmnist60k.npz fmnist_png --val 10000

Writes `images` (60000, 28, 28) uint8 and `labels` (60000,) from train-images-idx3-ubyte.gz and
train-labels-idx1-ubyte.gz (default folder: where the Debian package puts them; `--src DIR` for another).
"""

import argparse
import gzip
import struct
from pathlib import Path

import numpy as np

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--src", default="/usr/share/datasets/fashion-mnist")
a = p.parse_args()
src = Path(a.src)
with gzip.open(src / "train-images-idx3-ubyte.gz") as f:
    magic, n, rows, cols = struct.unpack(">IIII", f.read(16))
    assert magic == 2051, "not an idx3 image file"
    images = np.frombuffer(f.read(), dtype=np.uint8).reshape(n, rows, cols)
with gzip.open(src / "train-labels-idx1-ubyte.gz") as f:
    magic, m = struct.unpack(">II", f.read(8))
    assert magic == 2049 and m == n, "labels do not match the images"
    labels = np.frombuffer(f.read(), dtype=np.uint8)
np.savez_compressed(a.out, images=images, labels=labels)
print(f"{n} images {rows}x{cols}, {len(set(labels.tolist()))} classes -> {a.out}")
