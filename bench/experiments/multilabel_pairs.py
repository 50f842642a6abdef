"""A multi-label folder from real single-label images: each picture is two of them in two of the four quadrants of a
56 x 56 black square (28-px digits or clothes; square, so that the centre crop every image gets keeps both), labelled
with both classes (one, when the two share it), as a labels file with a space-separated label list and a split
column, the way fastai's and Kaggle's multi-label sets come.

    python bench/data/fashion_mnist.py fmnist60k.npz
    python bench/experiments/multilabel_pairs.py fmnist60k.npz fmnist_pairs --train 8000 --test 2000
    python train.py fit --data.root fmnist_pairs --data.labels fmnist_pairs/labels.csv --data.label_delimiter ' ' \
        --budget 5min
    vit-eval --ckpt checkpoints/folder/version_0/best-*.ckpt --split test --out eval/

Training and test pictures are built from disjoint halves of the source images (seeded), so no item is seen in both.
"""

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

FASHION = ("tshirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("npz", help="images (N, 28, 28) uint8 and labels (N,)")
    p.add_argument("out")
    p.add_argument("--train", type=int, default=8000)
    p.add_argument("--test", type=int, default=2000)
    p.add_argument("--names", choices=("fashion", "digits"), default="fashion")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    data = np.load(a.npz)
    images, labels = data["images"], data["labels"]
    names = FASHION if a.names == "fashion" else tuple(str(i) for i in range(10))
    rng = np.random.default_rng(a.seed)
    order = rng.permutation(len(images))
    pools = {"train": order[: len(order) // 2], "test": order[len(order) // 2 :]}
    out = Path(a.out)
    (out / "pairs").mkdir(parents=True, exist_ok=True)
    rows = ["path,labels,split"]
    for split, n in (("train", a.train), ("test", a.test)):
        pool = pools[split]
        for i in range(n):
            left, right = rng.choice(pool, size=2, replace=False)
            picture = np.zeros((56, 56), dtype=np.uint8)
            for item, quadrant in zip((left, right), rng.choice(4, size=2, replace=False)):
                y, x = 28 * (quadrant // 2), 28 * (quadrant % 2)
                picture[y : y + 28, x : x + 28] = images[item]
            path = f"pairs/{split}_{i:05d}.png"
            Image.fromarray(picture).save(out / path)
            both = sorted({names[int(labels[left])], names[int(labels[right])]})
            rows.append(f"{path},{' '.join(both)},{split}")
    (out / "labels.csv").write_text("\n".join(rows) + "\n")
    print(f"{a.train} training and {a.test} test pictures -> {out / 'labels.csv'}")


if __name__ == "__main__":
    main()
