"""The precision a run trains at, applied: `precision: auto` resolved in the parsed config before anything is built
(the rule: vit/planning/precision.py), and the Trainer that accepts `auto` when made in Python."""

from __future__ import annotations

from typing import Literal

import lightning as L
from lightning.fabric.connector import _PRECISION_INPUT

from vit.model.config import ViTConfig
from vit.planning.precision import precision_warning, resolve_precision


class ViTTrainer(L.Trainer):
    """Lightning's Trainer with `precision="auto"` (the shipped configs' value) accepted; the CLI resolves it before
    the Trainer is built (resolve_precision), so this only resolves it for a Trainer made in Python."""

    def __init__(self, *args, precision: _PRECISION_INPUT | Literal["auto"] | None = None, **kwargs):
        if str(precision) == "auto":
            precision = resolve_precision("auto", kwargs.get("accelerator"), None)[0]
        super().__init__(*args, precision=precision, **kwargs)


def apply_precision(config, explicit: set[str]) -> str | None:
    """Resolve `config.trainer.precision` (a jsonargparse Namespace of a subcommand) in place when it is "auto", and
    return the line to print: the choice and why, or the warning for a slow precision you typed (`explicit`: the keys
    you set, vit/run/planned.py explicit_keys). None when there is nothing to say."""
    requested = config.trainer.get("precision")
    accelerator = config.trainer.get("accelerator")
    if str(requested) == "auto":
        arch = config.model.get("arch")
        fields = arch.as_dict() if hasattr(arch, "as_dict") else dict(arch or {})
        side = (config.data.get("init_args") or {}).get("img_size") if config.get("data") else None
        try:
            cfg = ViTConfig.from_dict({**fields, **({"img_size": side} if side else {})})
        except (TypeError, ValueError):
            cfg = None  # the model's own checks report it when it is built
        value, why = resolve_precision("auto", accelerator, cfg)
        config.trainer.precision = value
        return f"precision: {value} ({why}; --trainer.precision overrides)"
    if "trainer.precision" in explicit:
        return precision_warning(requested, accelerator)
    return None
