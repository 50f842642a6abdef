"""The two small imbalanced folders on which the post-hoc tau rule was chosen beside Fashion-MNIST-LT100 (docs/recipes.md,
"Choosing the post-hoc tau"), each a folder the plan splits itself plus a held-out folder at the same prior:

    python bench/experiments/tau_sets.py fmnist60k.npz mnist10k.npz OUT

- OUT/pair/data, OUT/pair/test: Fashion-MNIST's T-shirts (majority) and shirts, 1,355 : 616 (class balance 0.45,
  under the long-tail rule's 0.5) and 450 : 205 held out.
- OUT/mnist_lt10/data, OUT/mnist_lt10/test: MNIST's 10 digits at imbalance 10 (600 down to 60 a class in a seeded
  class order, the CIFAR-LT profile), 2,452 images; 200 down to 20 a class held out (818).

fmnist60k.npz: ../shared/data/fashion_mnist.py; mnist10k.npz: ../shared/data/mnist10k.npz. Seeded (numpy, seed 0).
"""

import argparse
from pathlib import Path

import numpy as np
from PIL import Image


def write(root: Path, images: np.ndarray, labels: np.ndarray, names: list[str]) -> None:
    """root/<names[label]>/<index>.png, one grey PNG an image."""
    for k, (image, label) in enumerate(zip(images, labels)):
        folder = root / names[label]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"{k:05d}.png")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("fashion", help="fmnist60k.npz (images (N, 28, 28) uint8, labels (N,))")
    ap.add_argument("mnist", help="mnist10k.npz")
    ap.add_argument("out")
    args = ap.parse_args()
    out, rng = Path(args.out), np.random.default_rng(0)

    f = np.load(args.fashion)
    x, y = f["images"], f["labels"]
    tee, shirt = rng.permutation(np.flatnonzero(y == 0)), rng.permutation(np.flatnonzero(y == 6))
    data = np.concatenate([tee[:1355], shirt[:616]])
    test = np.concatenate([tee[1355:1805], shirt[616:821]])
    for name, idx in (("data", data), ("test", test)):
        write(out / "pair" / name, x[idx], (y[idx] == 6).astype(int), ["tshirt", "shirt"])

    m = np.load(args.mnist)
    x, y = m["images"], m["labels"]
    data, test = [], []
    for i, digit in enumerate(rng.permutation(10)):
        idx = rng.permutation(np.flatnonzero(y == digit))
        n, t = round(600 * 10 ** (-i / 9)), round(200 * 10 ** (-i / 9))
        data += list(idx[:n])
        test += list(idx[n : n + t])
    for name, idx in (("data", data), ("test", test)):
        write(out / "mnist_lt10" / name, x[idx], y[idx], [str(d) for d in range(10)])
    print(f"{out}/pair: 1,971 / 655 images; {out}/mnist_lt10: {len(data)} / {len(test)}")


if __name__ == "__main__":
    main()
