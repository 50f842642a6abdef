"""Dense relative localization (DRLoc; Liu et al., "Efficient Training of Visual Transformers with Small Datasets",
NeurIPS 2021): an auxiliary task for training a ViT from scratch on little data.

For each image, `pairs` pairs of tokens are drawn from the final gh x gw grid; a small MLP reads the two tokens side by
side and regresses their offset on the grid, ((i - p) / gh, (j - q) / gw); the L1 error of that regression, weighted
by `--model.drloc_weight`, is added to the classification loss. The ViT must keep in each output token where it is,
which it otherwise learns only from the labels. The MLP exists only for training: it sits beside the ViT in the
Lightning module (`drloc.*` in the checkpoint's state dict), never in the exported, served or timm-converted model.
"""

from __future__ import annotations

import torch
from torch import nn


class RelativeLocalization(nn.Module):
    """The DRLoc head and its loss: tokens (B, N, D) of a grid (gh, gw), N = gh * gw, row by row -> a scalar L1 loss.

    Args:
        dim: the tokens' width D.
        pairs: pairs drawn per image, with replacement.
        hidden: the width of the MLP's two hidden layers.
    """

    def __init__(self, dim: int, pairs: int = 64, hidden: int = 512):
        super().__init__()
        self.pairs = pairs
        self.mlp = nn.Sequential(
            nn.Linear(2 * dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2)
        )

    def forward(self, tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        b, n, d = tokens.shape
        gh, gw = grid
        if gh * gw != n:  # PatchDropout kept a subset: the positions are unknown (refused when the module is built)
            raise ValueError(f"drloc: {n} tokens are not the {gh} x {gw} grid")
        # Draws on the device: no host read on the hot path. idx: (2, B, pairs) token indices into the grid.
        idx = torch.randint(n, (2, b, self.pairs), device=tokens.device)
        flat = idx.permute(1, 0, 2).reshape(b, 2 * self.pairs)  # (B, 2 * pairs): the first tokens, then the second
        picked = torch.gather(tokens, 1, flat.unsqueeze(-1).expand(-1, -1, d))  # (B, 2 * pairs, D)
        first, second = picked[:, : self.pairs], picked[:, self.pairs :]  # (B, pairs, D) each
        rows, cols = idx.div(gw, rounding_mode="floor"), idx.remainder(gw)  # (2, B, pairs) each
        # offsets in units of the grid's side, in (-1, 1), as the paper normalises them
        target = torch.stack([(rows[0] - rows[1]) / gh, (cols[0] - cols[1]) / gw], dim=-1).to(tokens.dtype)
        predicted = self.mlp(torch.cat([first, second], dim=-1))  # (B, pairs, 2)
        return (predicted - target).abs().mean()
