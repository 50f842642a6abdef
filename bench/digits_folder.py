"""The built-in digits written as a folder the way users' folders look (mixed sizes 8-40 px and modes, PNG and JPEG):
root/train/<class>/ (1,437) and root/val/<class>/ (360). The generator is the tests' (tests/digits_folder.py).

    python bench/digits_folder.py /tmp/digits_png
    python train.py fit --data.root /tmp/digits_png --budget 3min
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from digits_folder import write_digits_folder  # noqa: E402

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    print(write_digits_folder(a.root, a.seed))
