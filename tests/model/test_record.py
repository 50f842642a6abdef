"""A checkpoint's record (vit/model/record.py): an older file without a key reads as its default, a broken key is one
line naming it, and the writer refuses to write what would not read back."""

import re
from pathlib import Path

import pytest
import torch

from vit.model.checkpoint import load_checkpoint
from vit.model.config import ViTConfig
from vit.model.record import CheckpointError, CheckpointRecord, check_record, read_record
from vit.training.checkpoint_io import AtomicCheckpointIO

CFG = ViTConfig(img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3)


def test_an_older_file_reads_as_the_defaults_and_a_broken_key_names_itself(tmp_path):
    names = ["0", "1", "2"]  # none of the keys: every default, the input and the classes the model's
    assert read_record({}, "old.ckpt", CFG) == CheckpointRecord(img_size=16, class_names=names, arch=CFG.to_dict())
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


# A read of a key of a checkpoint or its hyper-parameters: `ckpt["unknown"]`, `hparams.get("temperature", 1.0)`
READ = re.compile(r"""\b(hparams|hp|ckpt|checkpoint|raw)(\[\s*["'](\w+)["']\s*\]|\.get\(\s*["'](\w+)["'])""")
LIGHTNING_KEYS = {"state_dict", "hyper_parameters", "loops"}  # Lightning's own, read where Lightning's are read


def string_reads(text: str) -> list[str]:
    """The lines of `text` that read a toolkit key of a checkpoint by its string (writes, `ckpt["k"] = v`, are the
    writers' business and are not counted)."""
    found = []
    for line in text.splitlines():
        target = line.split(" = ")[0] if " = " in line and "(" not in line.split(" = ")[0] else ""
        for m in READ.finditer(line):
            key = m.group(3) or m.group(4)
            if key not in LIGHTNING_KEYS and not (m.group(3) and m.start() < len(target)):
                found.append(line.strip())
    return found


def test_no_key_of_a_checkpoint_is_read_by_its_string_outside_the_record():
    vit = Path(__file__).parents[2] / "vit"
    reads = {
        str(p.relative_to(vit)): string_reads(p.read_text())
        for p in sorted(vit.rglob("*.py"))
        if p.name != "record.py" and p.name != "start_weights.py"  # start_weights: the writer moving the sources
    }
    assert {k: v for k, v in reads.items() if v} == {}
    # the check finds a read, and leaves a write alone
    assert string_reads('t = hparams.get("temperature", 1.0)') and string_reads('x = ckpt["unknown"]["score"]')
    assert not string_reads('ckpt["calibration"] = found') and not string_reads('sd = ckpt["state_dict"]')
