"""An (images, labels) .npz resampled to another side, the way users' larger images arrive (bicubic, PIL).

python bench/experiments/resample_npz.py ../shared/data/mnist10k.npz /tmp/mnist64.npz 64     # then to_folder.py ... --val 2000
"""

import sys

import numpy as np
from PIL import Image


def main(src: str, dst: str, side: int) -> None:
    d = np.load(src)
    images = np.stack([np.asarray(Image.fromarray(x).resize((side, side), Image.BICUBIC)) for x in d["images"]])
    np.savez(dst, images=images, labels=d["labels"])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
