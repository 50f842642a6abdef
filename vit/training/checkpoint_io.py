"""Checkpoint writing that survives a kill and writes only a record that reads back, and reading that never runs
pickled code (Lightning's CheckpointIO)."""

import os
import tempfile
from pathlib import Path

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from vit.model.checkpoint import load_checkpoint
from vit.model.record import check_record


class AtomicCheckpointIO(TorchCheckpointIO):
    """Save: write a temporary file in the same folder, fsync, rename over the target (atomic on POSIX), fsync the
    folder. A kill during a save leaves the previous checkpoint intact. Load: `torch.load(weights_only=True)`, with a
    one-line error for a missing, truncated or unsafe file."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        path = Path(path)
        check_record(checkpoint, path)  # what is written reads back (vit/model/record.py); nothing is written if not
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself reaches the disk
        finally:
            os.close(dir_fd)

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        # weights_only=True, CheckpointError naming the file; the toolkit's own layout is checked where a user's file
        # comes in (train.py's --ckpt_path), not here: ddp_spawn reads back a bare state dict through this too
        return load_checkpoint(path, toolkit=False)
