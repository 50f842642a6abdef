"""Which config keys the user set, in a config file of their own or as a flag: those win over a plan, a fine-tune's
weights and the planner's start (vit/run/planned.py, fine_tune.py, start.py).

    keys = explicit_keys(sys.argv[1:], ["my.yaml"])   # {"model.lr", "data.init_args.batch_size", ...}
    is_explicit("model.arch.depth", keys)             # True when "model.arch.depth" or "model.arch" or "model" was set
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml


def _flatten(tree, prefix: str = "") -> set[str]:
    if not isinstance(tree, dict) or not tree:
        return {prefix} if prefix else set()
    keys = set()
    for k, v in tree.items():
        keys |= _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    return keys


def _canonical(key: str) -> str:
    """`data.root` and `data.init_args.root` name the same field (subclass mode accepts both)."""
    parts = key.split(".")
    if parts[0] == "data" and len(parts) > 1 and parts[1] not in ("init_args", "class_path"):
        parts.insert(1, "init_args")
    return ".".join(parts)


def shipped_recipe(path: str | Path) -> bool:
    """A recipe config shipped with the toolkit (configs/*.yaml of the package or this checkout, not the variants):
    with --budget its recipe fields are what the plan replaces; its data source, seed and logger stay."""
    package = Path(__file__).resolve().parent.parent  # vit/
    p = Path(path).resolve()
    return any(p.parent == root and p.suffix == ".yaml" for root in (package / "configs", package.parent / "configs"))


def explicit_keys(argv: Sequence[str], config_paths: Sequence[str | Path]) -> set[str]:
    """Every config key the user set: in a `--config` file of their own (not a shipped recipe: `python train.py
    --budget 30min` plans CIFAR-10 instead of keeping configs/cifar10.yaml's 200 epochs) or as a `--key value` flag.
    These win over the plan."""
    keys: set[str] = set()
    for path in config_paths:
        if shipped_recipe(path):
            continue
        try:
            keys |= _flatten(yaml.safe_load(Path(path).read_text()) or {})
        except (OSError, yaml.YAMLError):
            continue  # jsonargparse has parsed (or reported) it already
    for a in argv:
        if a.startswith("--") and a != "--config" and not a.startswith("--config="):
            keys.add(a[2:].split("=", 1)[0].rstrip("+"))
    return {_canonical(k) for k in keys}


def is_explicit(key: str, explicit: set[str]) -> bool:
    parts = key.split(".")
    return any(".".join(parts[:i]) in explicit for i in range(1, len(parts) + 1))
