"""Parameters held still in the first epochs of a run that starts from pretrained weights, and their BatchNorm
statistics with them.

    frozen = frozen_names(model, epoch, recipe)    # {"patch_embed.stem.conv_stem.weight", ...}
    hold_batchnorm(model, frozen, training=True)   # BatchNorm layers whose weights are frozen: eval mode
"""

from __future__ import annotations

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from vit.training.recipe import TrainingRecipe

HEADS = ("head.", "head_dist.", "fc_norm.")  # what `freeze_backbone_epochs` leaves trainable
STEM = "patch_embed.stem."  # a hybrid's CNN stem, held by `freeze_stem_epochs`


def frozen_epochs(recipe: TrainingRecipe) -> int:
    """The first epochs in which some parameters are held (no backward pass through them: those epochs cost less, so a
    run's speed is timed after them)."""
    return max(recipe.freeze_stem_epochs, recipe.freeze_backbone_epochs)


def frozen_names(model: torch.nn.Module, epoch: int, recipe: TrainingRecipe) -> set[str]:
    """The names of `model`'s parameters that take no gradient in `epoch`: all but the head's in the first
    `freeze_backbone_epochs`, a CNN stem's in the first `freeze_stem_epochs`."""
    names = [name for name, _ in model.named_parameters()]
    frozen = {n for n in names if not n.startswith(HEADS)} if epoch < recipe.freeze_backbone_epochs else set()
    if epoch < recipe.freeze_stem_epochs:
        frozen |= {n for n in names if n.startswith(STEM)}
    return frozen


def hold_batchnorm(model: torch.nn.Module, frozen: set[str], training: bool) -> None:
    """Put each BatchNorm layer of `model` in `training` mode, except those whose weight is in `frozen`: they stay in
    eval mode, so their running statistics are the loaded ones while the weights are. In training mode a frozen
    layer would still normalise with the new data's batch statistics and move its running averages to them: the
    pretrained features the freeze protects would change all the same."""
    for name, module in model.named_modules():
        if isinstance(module, _BatchNorm):
            module.train(training and f"{name}.weight" not in frozen)
