"""A seeded subset of an (images, labels) .npz, for development folders of a chosen size.

python bench/experiments/npz_subset.py fmnist60k.npz fmnist25k.npz 25000    # then to_folder.py ... --val 5000: 20,000 / 5,000
"""

import sys

import numpy as np


def main(src: str, dst: str, n: int, seed: int = 0) -> None:
    d = np.load(src)
    keep = np.sort(np.random.default_rng(seed).permutation(len(d["labels"]))[:n])
    np.savez(dst, images=d["images"][keep], labels=d["labels"][keep])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
