"""Learning-rate schedules (warmup then cosine, or warmup-stable-decay), layer-wise decay ids, and the training side of
progressive resizing: pure functions of the step, which the LightningModule hands to LambdaLR."""

import math

from lightning.pytorch.utilities import rank_zero_warn

from vit.model.config import ViTConfig

# warmup-stable-decay: the share of the steps that decay at the end (linear, to min_lr_ratio). Hagele et al. 2024
# found 10-20% matches cosine; the longer one suits short runs.
WSD_DECAY = 0.2


def layer_id(name: str, depth: int) -> int:
    """Depth of a parameter for layer-wise lr decay: embeddings 0, block i -> i + 1, final norm and head depth + 1."""
    if name.startswith(("patch_embed.", "pos_embed", "cls_token", "dist_token")):
        return 0
    if name.startswith("blocks."):
        return int(name.split(".")[1]) + 1
    return depth + 1


def schedule_warmup(warmup_epochs: float, steps_per_epoch: float, total: int, max_epochs: int | None) -> int:
    """Warmup steps for a schedule of `total` steps. Warmup as long as the whole schedule would train on the ramp
    alone and never reach the cosine: corrected to a tenth of the schedule, with a warning that says so."""
    warmup = int(warmup_epochs * steps_per_epoch)
    if warmup >= total:
        fixed = max(0, total // 10)
        rank_zero_warn(
            f"warmup_epochs={warmup_epochs} is not shorter than the schedule (max_epochs={max_epochs}, {total} steps): "
            f"warming up for {fixed} steps (a tenth) instead, then cosine; set --model.warmup_epochs to choose"
        )
        warmup = fixed
    return warmup


def lr_factor(hp, warmup_steps: int, total_steps: int):
    """The module's schedule (`hp.schedule`) as an LR multiplier per step."""
    if getattr(hp, "schedule", "cosine") == "wsd":
        return warmup_stable_decay(warmup_steps, total_steps, hp.min_lr_ratio)
    return warmup_cosine(warmup_steps, total_steps, hp.min_lr_ratio)


def warmup_stable_decay(warmup_steps: int, total_steps: int, min_ratio: float, decay: float = WSD_DECAY):
    """LR multiplier per step: linear warmup, 1 until the last `decay` share of the steps, then linear to min_ratio."""
    decay_start = max(warmup_steps, total_steps - int(decay * total_steps))

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        t = min(1.0, (step - decay_start) / max(1, total_steps - decay_start)) if step >= decay_start else 0.0
        return 1.0 - (1.0 - min_ratio) * t

    return factor


def train_side(cfg: ViTConfig, resize_from: int, resize_until: float, done: float) -> int | None:
    """Progressive resizing: the training side after `done` (0-1) of the epochs; None at full size. Sides grow by one
    patch per phase: from 14 to 28 with patch 7 and resize_until 0.5, 14 px for the first quarter, 21 px for the
    second, then 28."""
    if not resize_from or done >= resize_until:
        return None
    sides = list(range(resize_from, cfg.img_size, cfg.patch_size))
    return sides[min(len(sides) - 1, int(done / resize_until * len(sides)))]


def warmup_cosine(warmup_steps: int, total_steps: int, min_ratio: float):
    """LR multiplier per step: linear from ~0 to 1 over warmup_steps, then cosine down to min_ratio at total_steps."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        t = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t))

    return factor
