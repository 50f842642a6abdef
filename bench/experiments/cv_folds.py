"""Cross-validation folds of a class-subfolder image folder, as folders a user would train on: for fold k of K,
OUT/fold{k}/<class>/ holds the other K-1 parts (the folder `train.py fit --data.root` gets, which splits its own
validation share off) and OUT/test{k}/<class>/ the k-th part (seen by no run of that fold; `vit-eval` scores the
chosen checkpoint on it). Stratified by class and by the file-name prefix before the first '_' (the solar cells'
mono/poly type), seeded. Files are hard links (copies across file systems).

    python bench/experiments/cv_folds.py cells cells_cv --folds 4          # 1,970 cells: 4 x (1,477-1,478 / 492-493)
"""

import argparse
import os
import shutil
from collections import defaultdict
from pathlib import Path

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("out")
    p.add_argument("--folds", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    groups = defaultdict(list)
    for f in sorted(Path(a.root).glob("*/*")):
        groups[(f.parent.name, f.name.split("_")[0])].append(f)
    rng = np.random.default_rng(a.seed)
    fold_of = {}
    for key in sorted(groups):
        files = groups[key]
        for rank, i in enumerate(rng.permutation(len(files))):
            fold_of[files[i]] = rank % a.folds
    for f, k in fold_of.items():
        for j in range(a.folds):
            dst = Path(a.out) / (f"test{j}" if j == k else f"fold{j}") / f.parent.name / f.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(f, dst)
            except OSError:
                shutil.copy(f, dst)
    print({j: sum(k == j for k in fold_of.values()) for j in range(a.folds)}, "test images per fold")


if __name__ == "__main__":
    main()
