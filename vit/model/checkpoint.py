"""Load checkpoints as data, never as code.

`torch.load(weights_only=True)` refuses any pickle that would build an object other than tensors and plain
containers, so a checkpoint from a stranger cannot run code here. `ViTClassifier` keeps its hyper-parameters plain
(numbers, strings, lists) for exactly this reason.
"""

import pickle
from pathlib import Path

import torch

from vit.model.config import ViTConfig
from vit.model.vision_transformer import VisionTransformer


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and the reason in one line."""


def load_checkpoint(path: str | Path, toolkit: bool = True) -> dict:
    """Read a Lightning checkpoint of this toolkit safely. Raises CheckpointError naming the file. `toolkit=False`:
    any plain-data file (Lightning's ddp_spawn hands rank zero's weights back to the launcher as a bare state dict)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: refused to load: it holds pickled objects, not plain data ({first})") from None
    except Exception as e:  # a damaged file fails anywhere inside the unpickler: KeyError, EOFError, RuntimeError...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: not a readable checkpoint (truncated or another format: {first})") from None
    if toolkit and (
        not isinstance(ckpt, dict)
        or not isinstance(ckpt.get("state_dict"), dict)
        or not isinstance(ckpt.get("hyper_parameters"), dict)
    ):
        raise CheckpointError(f"{path}: not a checkpoint of this toolkit (no state_dict and hyper_parameters)")
    return ckpt


def arch_from_hparams(hparams: dict) -> ViTConfig:
    """The architecture saved in a checkpoint: `arch` (this version), or the flat fields of first-round checkpoints."""
    if isinstance(hparams.get("arch"), dict):
        return ViTConfig.from_dict(hparams["arch"])
    return ViTConfig.from_dict(hparams, strict=False)


def temperature_of(ckpt: dict, path) -> float:
    """The calibration temperature fitted after training (vit/evaluation/calibration.py); 1.0 for a checkpoint without
    one."""
    t = (ckpt.get("calibration") or {}).get("temperature", 1.0)
    if not isinstance(t, (int, float)) or not 0 < t < 1e3:
        raise CheckpointError(f"{path}: calibration temperature {t!r} must be a number in (0, 1000)")
    return float(t)


def unknown_of(ckpt: dict, path, cfg: ViTConfig) -> dict | None:
    """The rejection record stored after training (vit/evaluation/unknown.py: the score, its threshold, the
    statistics of the pooled features), checked for shapes; None for a checkpoint without one: it never says
    unknown."""
    record = ckpt.get("unknown")
    if record is None:
        return None
    stats = record.get("stats") if isinstance(record, dict) else None
    threshold = record.get("threshold") if isinstance(record, dict) else None
    if not isinstance(record.get("score") if stats is not None else None, str) or not isinstance(threshold, float):
        raise CheckpointError(f"{path}: its 'unknown' record has no score name, threshold and statistics")
    d, c, n = cfg.embed_dim, cfg.num_classes, cfg.depth
    per_class = record.get("class_thresholds")  # records made before per-class thresholds have none
    if per_class is not None and (not isinstance(per_class, list) or len(per_class) != c
                                  or not all(t is None or isinstance(t, float) for t in per_class)):  # fmt: skip
        raise CheckpointError(f"{path}: its 'unknown' class_thresholds must be {c} numbers or nulls, one per class")
    shapes = {"means": (c, d), "precision": (d, d), "background_mean": (d,), "background_precision": (d, d),
              "normalized_means": (c, d), "normalized_precision": (d, d), "block_means": (n, c, d),
              "block_precision": (n, d, d), "block_center": (n,), "block_spread": (n,), "input_mean": (5,),
              "input_precision": (5, 5), "class_precision": (n + 1, c, d, d), "class_logdet": (n + 1, c),
              "qda_center": (n + 1,), "qda_spread": (n + 1,)}  # fmt: skip
    parts = record["score"].split("+")  # a fused score: its parts' standardisation (vit.evaluation.unknown.fusion_of)
    fusion = record.get("fusion") if len(parts) > 1 else {"center": [0.0], "spread": [1.0]}
    if not isinstance(fusion, dict) or any(
        not isinstance(fusion.get(k), list) or len(fusion[k]) != len(parts) for k in ("center", "spread")
    ):
        raise CheckpointError(
            f"{path}: its 'unknown' score {record['score']!r} needs a fusion of {len(parts)} centers and spreads"
        )
    for key, value in stats.items():
        want = shapes.get(key)  # otherwise (the bank): (K, D)
        fits = isinstance(value, torch.Tensor) and (tuple(value.shape) == want if want else value.shape[-1] == d)
        if not fits:
            raise CheckpointError(
                f"{path}: unknown statistics {key!r} do not fit a {d}-wide, {n}-block model of {c} classes"
            )
    return record


MAX_IMG_SIZE = 4096  # a side beyond any ViT recipe: a checkpoint asking more would make predict allocate gigabytes


def field_problem(hparams: dict, cfg: ViTConfig) -> str | None:
    """What in a checkpoint's preprocessing fields disagrees with its architecture (None: nothing): the commands
    trust these to decode and normalise every image."""
    names = hparams.get("class_names")
    if names is not None and (not isinstance(names, list) or len(names) != cfg.num_classes):
        count = len(names) if isinstance(names, list) else names
        return f"class_names has {count!r} entries, num_classes={cfg.num_classes}"
    for key in ("mean", "std"):
        value = hparams.get(key)
        if value is None:
            continue
        if not isinstance(value, (list, tuple)) or len(value) != cfg.in_chans:
            return f"{key}={value!r} does not have in_chans={cfg.in_chans} values"
        if not all(isinstance(v, (int, float)) and v == v for v in value) or (key == "std" and min(value) <= 0):
            return f"{key}={value!r} must be numbers" + (" > 0" if key == "std" else "")
    if not 1 <= cfg.img_size <= MAX_IMG_SIZE:
        return f"img_size={cfg.img_size} is outside 1-{MAX_IMG_SIZE}"
    return None


def thresholds_of(ckpt: dict, path, num_classes: int) -> list[float]:
    """A multi-label model's per-label thresholds, chosen on the validation set after fit (vit/evaluation/
    multilabel.py); 0.5 each for a checkpoint saved before that."""
    thresholds = (ckpt.get("multilabel") or {}).get("thresholds", [0.5] * num_classes)
    if not (
        isinstance(thresholds, list)
        and len(thresholds) == num_classes
        and all(isinstance(t, (int, float)) and 0 <= t <= 1 for t in thresholds)
    ):
        raise CheckpointError(f"{path}: multilabel thresholds must be {num_classes} numbers in [0, 1]")
    return [float(t) for t in thresholds]


def load_model(path: str | Path) -> tuple[VisionTransformer, dict]:
    """The plain `VisionTransformer` of a training checkpoint, in eval mode, and its hyper-parameters, with the
    preprocessing facts at the top level: img_size, in_chans, mean, std, class_names."""
    return model_of(load_checkpoint(path), path)


def model_of(ckpt: dict, path: str | Path) -> tuple[VisionTransformer, dict]:
    """load_model for a checkpoint already read (load_checkpoint); `path` names it in errors."""
    hparams = ckpt["hyper_parameters"]
    try:
        cfg = arch_from_hparams(hparams)
        problem = field_problem(hparams, cfg)  # before anything is allocated
        if problem:
            raise CheckpointError(f"{path}: {problem}")
        model = VisionTransformer(cfg)
    except (TypeError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{path}: hyper-parameters do not build a model ({e})") from None
    hparams = {**hparams, "img_size": cfg.img_size, "in_chans": cfg.in_chans, "arch": cfg.to_dict()}
    hparams["temperature"] = temperature_of(ckpt, path)
    hparams["unknown"] = unknown_of(ckpt, path, cfg)
    if hparams.get("task") == "multilabel":
        hparams["thresholds"] = thresholds_of(ckpt, path, cfg.num_classes)
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        detail = " ".join(str(e).split())[:300]
        raise CheckpointError(
            f"{path}: weights do not fit the architecture in its hyper-parameters ({detail})"
        ) from None
    return model.eval(), hparams


def load_model_or_report(path: str | Path) -> tuple[VisionTransformer, dict] | None:
    """load_model for the commands: on a bad checkpoint print its one line to stderr and return None (exit 2)."""
    import sys

    try:
        return load_model(path)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return None
