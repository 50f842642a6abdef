"""Load checkpoints as data, never as code.

`torch.load(weights_only=True)` refuses any pickle that would build an object other than tensors and plain
containers, so a checkpoint from a stranger cannot run code here. `ViTClassifier` keeps its hyper-parameters plain
(numbers, strings, lists) for exactly this reason.
"""

import pickle
from pathlib import Path

import torch

from vit.model.record import (
    CheckpointError,
    CheckpointRecord,
    arch_from_hparams,
    field_problem,
    read_record,
    temperature_of,
    thresholds_of,
    unknown_of,
)
from vit.model.vision_transformer import VisionTransformer

# CheckpointError and the record's readers are vit/model/record.py's, importable from here too
__all__ = [
    "CheckpointError",
    "CheckpointRecord",
    "arch_from_hparams",
    "load_checkpoint",
    "load_model",
    "model_of",
    "temperature_of",
    "thresholds_of",
    "unknown_of",
]


def load_checkpoint(path: str | Path, toolkit: bool = True) -> dict:
    """Read a Lightning checkpoint of this toolkit safely: a file, or a run's folder or name (deployable_checkpoint).
    Raises CheckpointError naming the file. `toolkit=False`: any plain-data file (Lightning's ddp_spawn hands rank
    zero's weights back to the launcher as a bare state dict)."""
    path = deployable_checkpoint(path)
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


def deployable_checkpoint(text: str | Path) -> Path:
    """The checkpoint a command should load for `text`: a file as given; a run's folder (`checkpoints/folder`, or one
    of its `version_<n>`) or a run's name (`folder`: checkpoints/folder under the working folder): the newest
    version's best checkpoint (best-*.ckpt: the best epoch by the run's monitored score), else its last.ckpt. A path
    that is neither is returned as given (the loader says what is wrong with it)."""
    path = Path(text)
    if path.is_file():
        return path
    if not path.exists() and not path.is_absolute() and len(path.parts) == 1 and Path("checkpoints", path).is_dir():
        path = Path("checkpoints", path)
    if not path.is_dir():
        return path
    versions = sorted((v for v in path.glob("version_*") if v.name[8:].isdigit()), key=lambda v: int(v.name[8:]))
    for folder in versions[::-1] or [path]:
        best = sorted(folder.glob("best-*.ckpt"), key=lambda p: p.stat().st_mtime)
        if best or (folder / "last.ckpt").is_file():
            return best[-1] if best else folder / "last.ckpt"
    return path


def load_model(path: str | Path) -> tuple[VisionTransformer, CheckpointRecord]:
    """The plain `VisionTransformer` of a training checkpoint, in eval mode, and its record (vit/model/record.py):
    record.img_size, in_chans, mean, std, class_names, temperature, unknown, ..."""
    return model_of(load_checkpoint(path), path)


def model_of(ckpt: dict, path: str | Path) -> tuple[VisionTransformer, CheckpointRecord]:
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
    record = read_record(ckpt, path, cfg)  # an older file's missing keys are defaults; a broken one stops
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        detail = " ".join(str(e).split())[:300]
        raise CheckpointError(
            f"{path}: weights do not fit the architecture in its hyper-parameters ({detail})"
        ) from None
    return model.eval(), record


def load_model_or_report(path: str | Path) -> tuple[VisionTransformer, CheckpointRecord] | None:
    """load_model for the commands: on a bad checkpoint print its one line to stderr and return None (exit 2)."""
    import sys

    try:
        return load_model(path)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return None
