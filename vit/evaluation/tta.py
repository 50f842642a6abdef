"""Test-time augmentation over the symmetries a model was trained with: the mean of its logits over every view.

A model trained with flips and quarter turns (`data.init_args.hflip` / `rot90`: the planner sets them when the
classes keep under them) sees each image in up to 8 poses at training time; averaging its logits over the same
poses at test time removes the pose it happens to be shown in. Cost: one forward per view (2, 4 or 8 per image).

    model = SymmetryTTA(model, hflip=True, rot90=True)   # (B, C, S, S) -> (B, num_classes), 8 views
    views = tta_views(checkpoint_data_config)              # (hflip, rot90) as the checkpoint's data trained
"""

import torch
import torch.nn as nn


class SymmetryTTA(nn.Module):
    """Wrap a classifier: logits averaged over the images flipped left-right (`hflip`) and turned by 0-3 quarter
    turns (`rot90`; square images), the batch's views stacked into one forward."""

    def __init__(self, model: nn.Module, hflip: bool = False, rot90: bool = False):
        super().__init__()
        self.model, self.hflip, self.rot90 = model, hflip, rot90

    @property
    def views(self) -> int:
        return (2 if self.hflip else 1) * (4 if self.rot90 else 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.views == 1:
            return self.model(x)
        if self.rot90 and x.shape[-1] != x.shape[-2]:
            raise ValueError(f"test-time quarter turns need square images, got {x.shape[-2]}x{x.shape[-1]}")
        poses = [x, x.flip(-1)] if self.hflip else [x]
        if self.rot90:
            poses = [torch.rot90(p, k, (-2, -1)) for p in poses for k in range(4)]
        B = x.shape[0]
        logits = self.model(torch.cat(poses))  # (V * B, C)
        return logits.view(len(poses), B, -1).mean(0)


def tta_views(data_config: dict | None) -> tuple[bool, bool]:
    """(hflip, rot90) of a checkpoint's training data config ({"class_path", "init_args"}), (False, False) if none."""
    args = (data_config or {}).get("init_args", {}) or {}
    return bool(args.get("hflip", False)), bool(args.get("rot90", False))
