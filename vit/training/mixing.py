"""timm's Mixup/CutMix for targets that are already class probabilities (soft labels from a CSV or a folder)."""

import torch
from timm.data import Mixup


def mix_soft(mixup: Mixup, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """timm's Mixup/CutMix for targets that are already probabilities (B, C): timm's `__call__` one-hots class
    indices, so the images are mixed by its per-batch draw (`_mix_batch`, in place; lam corrected for the CutMix box)
    and the targets mixed here with the same lam and the same reversed pairing, smoothed as timm smooths."""
    lam = mixup._mix_batch(x)
    smoothing, classes = mixup.label_smoothing, y.shape[-1]
    y = y * (1.0 - smoothing) + smoothing / classes
    return x, y * lam + y.flip(0) * (1.0 - lam)
