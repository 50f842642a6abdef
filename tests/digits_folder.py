"""The built-in digits written as a folder the way users' folders look: mixed sizes (8-40 px) and modes (grayscale,
RGB, RGBA, palette), PNG and JPEG, in root/train/<class>/ (1,437) and root/val/<class>/ (360, the split of
DigitsDataModule).

    python bench/digits_folder.py /tmp/digits_png       # the command; tests import write_digits_folder from here
    python train.py fit --data.root /tmp/digits_png --budget 3min
"""

from pathlib import Path

import numpy as np
import torch
from PIL import Image

MODES = ("L", "RGB", "RGBA", "P")


def write_digits_folder(root: str | Path, seed: int = 0, val_size: int = 360, limit: int | None = None) -> Path:
    """Write the digits (the first `limit` of the seeded order: tests use a few hundred); returns root."""
    from sklearn.datasets import load_digits

    root = Path(root)
    digits = load_digits()
    perm = torch.randperm(len(digits.target), generator=torch.Generator().manual_seed(0)).tolist()
    rng = np.random.default_rng(seed)
    for rank, i in enumerate(perm[:limit]):
        split = "val" if rank < val_size else "train"
        side = int(rng.integers(8, 41))
        grey = Image.fromarray((digits.images[i] * 255 / 16).round().astype(np.uint8), "L")
        img = grey.resize((side, side), Image.Resampling.BILINEAR)
        mode = MODES[int(rng.integers(len(MODES)))]
        img = img.convert(mode) if mode != "P" else img.convert("RGB").quantize(64)
        ext = ".jpg" if mode in ("L", "RGB") and rng.random() < 0.3 else ".png"
        out = root / split / str(digits.target[i]) / f"{i:04d}{ext}"
        out.parent.mkdir(parents=True, exist_ok=True)
        img.save(out, quality=95) if ext == ".jpg" else img.save(out)
    return root
