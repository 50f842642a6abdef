"""Labelled images for scoring, read exactly as vit-predict reads them: file batches (FileBatches), a folder of
class folders (labelled_folder), and the data a checkpoint was trained on, rebuilt from its record (training_data)."""

import importlib
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from vit.data.base import ImageClassificationData
from vit.data.images import expand_inputs
from vit.data.transforms import DataError
from vit.deployment.predict import ImageFiles, channel_stats, collate, normalize
from vit.model.checkpoint import CheckpointError
from vit.model.record import CheckpointRecord


class FileBatches:
    """(normalised images, targets) batches of image files, decoded, batched and normalised as vit-predict does
    (vit.deployment.predict.ImageFiles), so that every prediction equals vit-predict's. Unreadable files are reported on
    stderr, left out, and listed in `.errors`; `.kept` lists the positions scored, in order."""

    def __init__(self, files: list[str], targets, record: CheckpointRecord, batch_size: int, workers, device):
        # targets: class indices, or a multi-label model's (N, C) 0/1 tensor
        self.files, self.device = files, device
        self.targets = targets if isinstance(targets, torch.Tensor) else torch.tensor(targets, dtype=torch.long)
        if workers is None:  # as vit-predict: leave a core to the forward
            workers = max(1, min(4, (os.cpu_count() or 2) - 1)) if len(files) > batch_size else 0
        self.loader = DataLoader(
            ImageFiles(files, record.img_size, record.in_chans),
            batch_size=batch_size,
            num_workers=workers,
            collate_fn=collate,
            pin_memory=device.type == "cuda",
        )
        self.mean, self.std = channel_stats(record, device)
        self.kept: list[int] = []
        self.errors: list[tuple[str, str]] = []

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for x, idx, errors in self.loader:
            for i, err in errors:
                self.errors.append((self.files[i], err))
                print(f"{self.files[i]}: error: {err}", file=sys.stderr)
            if x is not None:
                self.kept.extend(idx)
                yield normalize(x.to(self.device, non_blocking=True), self.mean, self.std), self.targets[idx]


def labelled_folder(root: Path, classes: list[str]) -> tuple[list[str], list[int]]:
    """Every image under root/<class>/ (recursively, in vit-predict's order) and its class index; a folder that is
    not one of the checkpoint's classes, or an image outside any class folder, is a DataError naming it."""
    if not root.is_dir():
        raise DataError(f"{root}: not a folder (expected {root}/<class>/<image>, torch/<name> or --split val)")
    index = {c: i for i, c in enumerate(classes)}
    for sub in sorted(p for p in root.iterdir() if p.is_dir()):
        if sub.name not in index:
            shown = ", ".join(classes[:10]) + (", ..." if len(classes) > 10 else "")
            raise DataError(f"{sub}: '{sub.name}' is not one of the checkpoint's {len(classes)} classes ({shown})")
    files = expand_inputs([str(root)])
    if not files:
        raise DataError(f"{root}: no image files under {root}/<class>/")
    targets = []
    for f in files:
        parts = Path(f).relative_to(root).parts
        if len(parts) < 2:
            raise DataError(f"{f}: not inside a class folder (expected {root}/<class>/<image>)")
        targets.append(index[parts[0]])
    return files, targets


def training_data(path: str, record: CheckpointRecord):
    """The data module a checkpoint was trained on, from its `data` record (vit.training.callbacks.DataRecord: the
    class_path and init_args, checked by read_record); only this toolkit's own data classes are built, whatever the
    file names."""
    if record.data is None:
        raise CheckpointError(f"{path}: holds no record of its training data (older than vit-eval): give a folder")
    class_path, init_args = record.data["class_path"], record.data.get("init_args")
    module, _, name = class_path.rpartition(".")
    cls = getattr(importlib.import_module(module), name, None) if module.split(".")[0] == "vit" else None
    if not (isinstance(cls, type) and issubclass(cls, ImageClassificationData)):
        raise CheckpointError(f"{path}: data class {class_path!r} is not one of this toolkit's")
    args = dict(init_args or {})
    if name == "ImageFolderDataModule":  # only the file lists: the files are decoded below, as vit-predict does
        args.update(check_images=False, in_memory=False, mean=list(record.mean), std=list(record.std))
    return cls(**args)
