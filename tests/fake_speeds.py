"""Fake training speeds for planner tests: the planner's rules without timing this machine."""

from vit.planning.rules import MODELS
from vit.planning.speed import Machine

CPU2 = Machine("cpu", 2)


def speeds_like_2_cores(archs, batch, precision="32-true"):
    """Images/s of a training step, roughly as measured on the 2-core CPU at 16 tokens: halves per model step; bf16
    slower, as on a CPU without AMX."""
    widths = [m[0] for m in MODELS]
    return [3000.0 / 2 ** widths.index(a.embed_dim) * (0.7 if precision == "bf16-mixed" else 1.0) for a in archs]


def speeds_by_tokens(archs, batch, precision="32-true"):
    """speeds_like_2_cores at 16 tokens, and a step's cost growing with the tokens (64 tokens: 4x slower)."""
    return [s * 16 / (a.img_size // a.patch_size) ** 2 for s, a in zip(speeds_like_2_cores(archs, batch), archs)]
