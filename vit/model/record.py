"""What a checkpoint of this toolkit holds besides Lightning's own keys and the weights, typed: `CheckpointRecord`.

`read_record(ckpt, path, cfg)` is every reader's way in. A key that is missing is an older file (or a run that did not
compute it) and reads as its default: no calibration (temperature 1.0), no rejection record (never unknown), a
threshold of 0.5 a label. A key that is there but malformed is a broken file: a `CheckpointError` naming the file and
the key. `check_record` is the writers' (vit/training/checkpoint_io.py calls it before every save), so a file this
toolkit writes always reads back. docs/architecture.md, "A checkpoint's keys", says who writes each.

    record = read_record(ckpt, "best.ckpt", arch_from_hparams(ckpt["hyper_parameters"]))
    record.img_size, record.mean, record.class_names, record.temperature, record.unknown, record.thresholds
"""

from dataclasses import dataclass, field
from pathlib import Path

import torch

from vit.model.config import ViTConfig

# The keys this toolkit adds to Lightning's: a file holding any of them is checked before it is written (check_record)
RECORD_KEYS = (
    "data",
    "calibration",
    "unknown",
    "multilabel",
    "logit_adjustment",
    "label_issues",
    "teacher",
    "init_from",
    "stem_from",
    "rng_states",
)


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and the reason in one line."""


@dataclass(frozen=True)
class CheckpointRecord:
    """What a command needs of a checkpoint besides the weights, each field its default where the file has no such
    key. The input: an image decoded to `in_chans` channels, resized to `img_size` x `img_size`, normalised by
    `mean` and `std`; the output: `class_names[i]` is logit i."""

    img_size: int = 224
    in_chans: int = 3
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    class_names: list[str] = field(default_factory=list)  # the file's, else "0" .. "C-1" (names_or_numbers)
    task: str = "multiclass"  # or "multilabel": one sigmoid a label, each given at or above its threshold
    arch: dict | None = None  # the ViTConfig as a dict; None for an ONNX export (its sidecar describes the input)
    temperature: float = 1.0  # `calibration.temperature`: softmax(logits / T) is what predict serves
    unknown: dict | None = None  # the rejection record (vit/evaluation/unknown.py); None: never unknown
    thresholds: list[float] | None = None  # `multilabel.thresholds`, one per label (multi-label models only)
    data: dict | None = None  # the DataModule's class_path and init_args (vit-eval --split)
    logit_adjustment: dict | None = None  # tau, the prior and the scores (already folded into the head)
    label_issues: str | None = None  # the path of label_issues.csv
    teacher: dict | None = None  # the teacher's name and scores alone

    @property
    def multilabel(self) -> bool:
        return self.task == "multilabel"

    def rejection(self) -> dict | None:
        """The rejection record without its statistics (the score, its threshold and fusion, the per-class
        thresholds): what vit-serve's /info shows and an export's sidecar holds beside its statistics file."""
        if self.unknown is None:
            return None
        return {k: self.unknown.get(k) for k in ("score", "threshold", "fusion", "class_thresholds")}


def names_or_numbers(names, num_classes: int) -> list[str]:
    """The class names a file gives, or "0" .. "C-1" where it gives none."""
    return list(names) if names else [str(i) for i in range(num_classes)]


def read_record(ckpt: dict, path, cfg: ViTConfig, multilabel: bool | None = None) -> CheckpointRecord:
    """The record of a checkpoint already read (vit/model/checkpoint.py load_checkpoint) for the model `cfg`
    (`multilabel`: None reads the task from the hyper-parameters)."""
    for key in ("data", "logit_adjustment", "teacher"):
        if ckpt.get(key) is not None and not isinstance(ckpt[key], dict):
            raise CheckpointError(f"{path}: its {key!r} record must be a mapping, not {type(ckpt[key]).__name__}")
    data = ckpt.get("data")
    if data is not None and not isinstance(data.get("class_path"), str):
        raise CheckpointError(f"{path}: its 'data' record names no class_path")
    adjustment = ckpt.get("logit_adjustment")
    if adjustment is not None and not isinstance(adjustment.get("tau"), (int, float)):
        raise CheckpointError(f"{path}: its 'logit_adjustment' record has no tau")
    issues = ckpt.get("label_issues")
    if issues is not None and not isinstance(issues, str):
        raise CheckpointError(f"{path}: its 'label_issues' record must be a path")
    hp = ckpt.get("hyper_parameters") or {}
    task = hp.get("task") or ("multilabel" if multilabel else "multiclass")
    flat = (0.5,) * cfg.in_chans  # the DataModule's default normalisation, for a file without its own
    return CheckpointRecord(
        img_size=cfg.img_size,
        in_chans=cfg.in_chans,
        mean=tuple(float(v) for v in hp.get("mean") or flat),
        std=tuple(float(v) for v in hp.get("std") or flat),
        class_names=names_or_numbers(hp.get("class_names"), cfg.num_classes),
        task=task,
        arch=cfg.to_dict(),
        temperature=temperature_of(ckpt, path),
        unknown=unknown_of(ckpt, path, cfg),
        thresholds=thresholds_of(ckpt, path, cfg.num_classes) if task == "multilabel" else None,
        data=data,
        logit_adjustment=adjustment,
        label_issues=issues,
        teacher=ckpt.get("teacher"),
    )


def given_preprocessing(ckpt: dict) -> tuple[tuple | None, tuple | None, list[str] | None]:
    """The mean, std and class names a checkpoint's hyper-parameters give, each None where they give none: a run that
    starts from its weights takes its data's own then (vit/model/pretrained.py)."""
    hp = ckpt.get("hyper_parameters") or {}
    mean, std, names = hp.get("mean"), hp.get("std"), hp.get("class_names")
    return (tuple(mean) if mean else None), (tuple(std) if std else None), (list(names) if names else None)


def rng_states_of(ckpt: dict) -> dict | None:
    """The random generators' states a checkpoint saved (vit/training/rng.py), None in a file without them."""
    return ckpt.get("rng_states")


def sidecar_record(meta: dict, num_classes: int, unknown: dict | None) -> CheckpointRecord:
    """The record of an ONNX export from its JSON sidecar (vit/deployment/export.py sidecar writes it; the caller
    checks img_size, mean and std are there) and its rejection record with the statistics read back."""
    in_chans = int(meta.get("in_chans", 3))
    return CheckpointRecord(
        img_size=int(meta["img_size"]),
        in_chans=in_chans,
        mean=tuple(float(v) for v in meta["mean"]),
        std=tuple(float(v) for v in meta["std"]),
        class_names=names_or_numbers(meta.get("class_names"), num_classes),
        task=meta.get("task") or "multiclass",
        temperature=float(meta.get("temperature", 1.0)),
        unknown=unknown,
        thresholds=meta.get("thresholds"),
    )


def check_record(ckpt: dict, path: str | Path) -> None:
    """Raise CheckpointError if a checkpoint about to be written would not read back (read_record). A plain-data file
    that is not a toolkit checkpoint (ddp_spawn's bare state dict) is not checked."""
    hparams = ckpt.get("hyper_parameters") if isinstance(ckpt, dict) else None
    if isinstance(hparams, dict) and any(key in ckpt for key in RECORD_KEYS):
        read_record(ckpt, path, arch_from_hparams(hparams))


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


# The shapes of the rejection statistics for a D-wide, N-block model of C classes (vit/evaluation/unknown.py writes
# them); the KNN bank, (K, D), is any K
def unknown_shapes(d: int, c: int, n: int) -> dict[str, tuple[int, ...]]:
    return {
        "means": (c, d),
        "precision": (d, d),
        "background_mean": (d,),
        "background_precision": (d, d),
        "normalized_means": (c, d),
        "normalized_precision": (d, d),
        "block_means": (n, c, d),
        "block_precision": (n, d, d),
        "block_center": (n,),
        "block_spread": (n,),
        "input_mean": (5,),
        "input_precision": (5, 5),
        "class_precision": (n + 1, c, d, d),
        "class_logdet": (n + 1, c),
        "qda_center": (n + 1,),
        "qda_spread": (n + 1,),
    }


def unknown_of(ckpt: dict, path, cfg: ViTConfig) -> dict | None:
    """The rejection record stored after training (the score, its threshold, the statistics of the pooled features),
    checked for shapes; None for a checkpoint without one: it never says unknown."""
    record = ckpt.get("unknown")
    if record is None:
        return None
    stats = record.get("stats") if isinstance(record, dict) else None
    threshold = record.get("threshold") if isinstance(record, dict) else None
    if not isinstance(record.get("score") if stats is not None else None, str) or not isinstance(threshold, float):
        raise CheckpointError(f"{path}: its 'unknown' record has no score name, threshold and statistics")
    d, c, n = cfg.embed_dim, cfg.num_classes, cfg.depth
    per_class = record.get("class_thresholds")  # records made before per-class thresholds have none
    if per_class is not None and (
        not isinstance(per_class, list)
        or len(per_class) != c
        or not all(t is None or isinstance(t, float) for t in per_class)
    ):
        raise CheckpointError(f"{path}: its 'unknown' class_thresholds must be {c} numbers or nulls, one per class")
    parts = record["score"].split("+")  # a fused score: its parts' standardisation (vit.evaluation.unknown.fusion_of)
    fusion = record.get("fusion") if len(parts) > 1 else {"center": [0.0], "spread": [1.0]}
    if not isinstance(fusion, dict) or any(
        not isinstance(fusion.get(k), list) or len(fusion[k]) != len(parts) for k in ("center", "spread")
    ):
        raise CheckpointError(
            f"{path}: its 'unknown' score {record['score']!r} needs a fusion of {len(parts)} centers and spreads"
        )
    shapes = unknown_shapes(d, c, n)
    for key, value in stats.items():
        want = shapes.get(key)  # otherwise (the bank): (K, D)
        fits = isinstance(value, torch.Tensor) and (tuple(value.shape) == want if want else value.shape[-1] == d)
        if not fits:
            raise CheckpointError(
                f"{path}: unknown statistics {key!r} do not fit a {d}-wide, {n}-block model of {c} classes"
            )
    return record
