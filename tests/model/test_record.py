"""A checkpoint's record (vit/model/record.py): an older file without a key reads as its default, a broken key is one
line naming it, and the writer refuses to write what would not read back."""

import pytest
import torch

from vit.model.checkpoint import load_checkpoint
from vit.model.config import ViTConfig
from vit.model.record import CheckpointError, CheckpointRecord, check_record, read_record
from vit.training.checkpoint_io import AtomicCheckpointIO

CFG = ViTConfig(img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3)


def test_an_older_file_reads_as_the_defaults_and_a_broken_key_names_itself(tmp_path):
    assert read_record({}, "old.ckpt", CFG) == CheckpointRecord()  # none of the keys: every default
    assert read_record({}, "old.ckpt", CFG, multilabel=True).thresholds == [0.5] * 3
    broken = {
        "calibration": ({"temperature": -1.0}, "calibration temperature -1.0"),
        "data": ({"init_args": {}}, "'data' record names no class_path"),
        "logit_adjustment": ({"prior": [0.5, 0.5]}, "'logit_adjustment' record has no tau"),
        "label_issues": (3, "'label_issues' record must be a path"),
        "teacher": ("regnetx_002", "'teacher' record must be a mapping"),
        "unknown": ({"score": "mahalanobis", "threshold": 1.0, "stats": {"means": torch.zeros(2, 16)}}, "'means'"),
    }
    for key, (value, says) in broken.items():
        with pytest.raises(CheckpointError, match=f"x.ckpt: .*{says}"):
            read_record({key: value}, "x.ckpt", CFG)


def test_the_writer_refuses_a_record_that_would_not_read_back_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "last.ckpt"
    good = {"state_dict": {}, "hyper_parameters": {"arch": CFG.to_dict()}, "calibration": {"temperature": 1.5}}
    AtomicCheckpointIO().save_checkpoint(good, path)
    bad = {**good, "calibration": {"temperature": float("nan")}}
    with pytest.raises(CheckpointError, match="calibration temperature nan"):
        AtomicCheckpointIO().save_checkpoint(bad, path)
    assert load_checkpoint(path)["calibration"] == {"temperature": 1.5}  # nothing written over it
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left
    check_record({"state_dict": {}}, path)  # ddp_spawn's bare state dict: not a toolkit checkpoint, not checked
