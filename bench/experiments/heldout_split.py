"""A held-out folder beside a to_folder.py folder: the last HELD of its VAL validation images (the same seeded order
as bench/data/to_folder.py --seed 0) move to ROOT_heldout/<class>/, images that neither training nor the
temperature fit will see.

    python bench/data/to_folder.py fmnist60k.npz fmnist_png --val 15000
    python bench/experiments/heldout_split.py fmnist60k.npz fmnist_png 15000 5000    # 45,000 / 10,000 / 5,000
"""

import shutil
import sys
from pathlib import Path

import numpy as np


def main(npz: str, root: str, val: int, held: int) -> None:
    root_path = Path(root)
    y = np.load(npz)["labels"]
    order = np.random.default_rng(0).permutation(len(y))
    for i in order[val - held : val]:
        src = root_path / "val" / str(int(y[i])) / f"{i:05d}.png"
        dst = root_path.parent / (root_path.name + "_heldout") / str(int(y[i])) / src.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(src, dst)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
