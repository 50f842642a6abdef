# Writes a tiny two-class folder of 16-px PNGs: stripes one way for class a, the other way for b, with noise.
from pathlib import Path

import numpy as np
from PIL import Image

rng = np.random.default_rng(0)
for c, axis in (("across", 0), ("down", 1)):
    d = Path("folder") / c
    d.mkdir(parents=True, exist_ok=True)
    for i in range(16):
        x = np.zeros((16, 16, 3), np.uint8)
        stripes = (np.arange(16) // 2 % 2 * 200).astype(np.uint8)
        x[:] = stripes[:, None, None] if axis == 0 else stripes[None, :, None]
        x = np.clip(x.astype(int) + rng.integers(0, 40, x.shape), 0, 255).astype(np.uint8)
        Image.fromarray(x).save(d / f"{i:02d}.png")
