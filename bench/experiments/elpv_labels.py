"""The solar cells as users get them from the wheel: one flat folder of images and a labels file with each cell's defect
probability (0, 1/3, 2/3, 1), no class folders. For K cross-validation folds it writes OUT/labels_fold{k}.csv
(path, probability, type, split): fold k's part as `test` rows (scored once at the end of fit, chosen on by nothing),
the rest as training rows (the run splits its own stratified validation share off them). Folds are stratified by
probability and cell type, seeded. Files are hard links (copies across file systems).

    python bench/data/solar_cells.py wheels/elpv_dataset-1.0.0.post1-py3-none-any.whl cells4 --classes 4
    python bench/experiments/elpv_labels.py cells4 cells_csv --folds 4
    python train.py fit --data.root cells_csv --data.labels cells_csv/labels_fold0.csv --budget 5min
"""

import argparse
import os
import shutil
from collections import defaultdict
from pathlib import Path

import numpy as np

# solar_cells.py's 4-class folder names -> the probability the wheel's labels.csv gives
PROBABILITY = {"functional": 0.0, "possibly_defective": 1 / 3, "likely_defective": 2 / 3, "defective": 1.0}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("cells4", help="solar_cells.py --classes 4's folder: <class>/<type>_cellNNNN.png")
    p.add_argument("out")
    p.add_argument("--folds", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    out = Path(a.out)
    (out / "cells").mkdir(parents=True, exist_ok=True)
    groups = defaultdict(list)
    for f in sorted(Path(a.cells4).glob("*/*.png")):
        dst = out / "cells" / f.name
        if not dst.exists():
            try:
                os.link(f, dst)
            except OSError:
                shutil.copy(f, dst)
        groups[(PROBABILITY[f.parent.name], f.name.split("_")[0])].append(f"cells/{f.name}")
    rng = np.random.default_rng(a.seed)
    fold_of = {}
    for key in sorted(groups):
        files = groups[key]
        for rank, i in enumerate(rng.permutation(len(files))):
            fold_of[files[i]] = (key, rank % a.folds)
    for k in range(a.folds):
        rows = ["path,probability,type,split"]
        for path, ((prob, kind), fold) in sorted(fold_of.items()):
            rows.append(f"{path},{prob!r},{kind},{'test' if fold == k else 'train'}")
        (out / f"labels_fold{k}.csv").write_text("\n".join(rows) + "\n")
    print({k: sum(f == k for _, f in fold_of.values()) for k in range(a.folds)}, "test rows per fold")


if __name__ == "__main__":
    main()
