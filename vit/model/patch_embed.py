"""Images to patch tokens: (B, C, H, W) -> (B, N, D) on the grid `patch_grid` gives, N = (H/p) * (W/p).

The plain embedding is one strided convolution (`proj`); the stems of the literature replace it with a convolutional,
residual or pretrained-CNN stem before a 1x1 `proj` (`StemPatchEmbed`), or with shifted patches (`ShiftedPatchEmbed`).
`build_patch_embed(cfg)` at the end picks one from `ViTConfig.stem`. timm's module names (`patch_embed.proj`), so
state dicts map onto timm's.
"""

import torch
import torch.nn as nn

from vit.model.config import ViTConfig
from vit.model.stems import HYBRID_STEMS, CnnStem, conv_stem, resnet_stem, shifted_patches, stem_widths


def patch_grid(size: int | tuple[int, int], patch_size: int) -> tuple[int, int]:
    """The token grid (rows, columns) of an image of `size` px (a side, or (H, W)) cut into patch_size patches: every
    stem reduces by exactly patch_size (a CNN stem's stages to that stride)."""
    H, W = (size, size) if isinstance(size, int) else size
    if H % patch_size or W % patch_size:
        raise ValueError(f"input size {H}x{W} is not divisible by patch_size={patch_size}")
    return H // patch_size, W // patch_size


class PatchEmbed(nn.Module):
    """Non-overlapping p x p patches, each projected to D by one strided convolution (`proj`)."""

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int):
        super().__init__()
        self.patch_size, self.in_chans = patch_size, in_chans
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def grid(self, x: torch.Tensor) -> tuple[int, int]:
        return patch_grid(tuple(x.shape[-2:]), self.patch_size)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """(B, C, H, W) -> tokens (B, N, D) and their grid (H/p, W/p)."""
        grid = self.grid(x)
        return self.proj(x).flatten(2).transpose(1, 2), grid  # (B, D, H/p, W/p) -> (B, N, D)


class StemPatchEmbed(PatchEmbed):
    """A convolutional stem to stride p (`stem`: 'conv', 'resnet', or a timm EfficientNet-Lite's first stages,
    vit/model/stems.py), then a 1x1 convolution (`proj`) to the token width."""

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int, stem: str):
        nn.Module.__init__(self)
        self.patch_size, self.in_chans = patch_size, in_chans
        if stem in HYBRID_STEMS:
            self.stem = CnnStem(stem, in_chans, patch_size)
            width = self.stem.out_chans
        else:
            self.stem = (conv_stem if stem == "conv" else resnet_stem)(in_chans, embed_dim, patch_size)
            width = stem_widths(embed_dim, patch_size)[-1]
        self.proj = nn.Conv2d(width, embed_dim, kernel_size=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        grid = self.grid(x)
        return self.proj(self.stem(x)).flatten(2).transpose(1, 2), grid  # (B, D, H/p, W/p) -> (B, N, D)


class ShiftedPatchEmbed(PatchEmbed):
    """Shifted Patch Tokenization (Lee et al. 2021): each patch with its four half-patch-shifted copies, C -> 5C
    channels, LayerNorm (`norm`), then a linear layer (`proj`)."""

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int):
        nn.Module.__init__(self)
        self.patch_size, self.in_chans = patch_size, in_chans
        self.norm = nn.LayerNorm(5 * in_chans * patch_size**2, eps=1e-6)
        self.proj = nn.Linear(5 * in_chans * patch_size**2, embed_dim)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        grid = self.grid(x)
        return self.proj(self.norm(shifted_patches(x, self.patch_size))), grid  # (B, N, D)


def build_patch_embed(cfg: ViTConfig) -> PatchEmbed:
    """The patch embedding `cfg.stem` names: 'patch' (plain), 'spt', or a stem for StemPatchEmbed."""
    if cfg.stem == "patch":
        return PatchEmbed(cfg.patch_size, cfg.in_chans, cfg.embed_dim)
    if cfg.stem == "spt":
        return ShiftedPatchEmbed(cfg.patch_size, cfg.in_chans, cfg.embed_dim)
    return StemPatchEmbed(cfg.patch_size, cfg.in_chans, cfg.embed_dim, cfg.stem)
