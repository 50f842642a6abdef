"""Checkpoints, ONNX exports and plan.yaml files written by an older main (tests/legacy/, made before the package
was split into subpackages) still load and give the same answers."""

import json
import runpy
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, fit_in

LEGACY = Path(ROOT) / "tests" / "legacy"
EXPECTED = json.loads((LEGACY / "expected.json").read_text())


def fixed_input(in_chans: int, img_size: int) -> torch.Tensor:
    return torch.linspace(-2, 2, 2 * in_chans * img_size * img_size).reshape(2, in_chans, img_size, img_size)


def test_old_checkpoint_gives_the_same_logits():
    from vit.model.checkpoint import load_model

    model, _ = load_model(LEGACY / "model.ckpt")
    side = json.loads((LEGACY / "model.onnx.json").read_text())  # img_size, in_chans
    with torch.no_grad():
        logits = model.eval()(fixed_input(side["in_chans"], side["img_size"]))
    torch.testing.assert_close(logits, torch.tensor(EXPECTED["logits"]), atol=1e-6, rtol=0)


def test_old_onnx_export_gives_the_same_logits():
    import onnxruntime as ort  # pinned in requirements.txt: a missing one fails, it does not skip

    side = json.loads((LEGACY / "model.onnx.json").read_text())
    session = ort.InferenceSession(str(LEGACY / "model.onnx"), providers=["CPUExecutionProvider"])
    x = fixed_input(side["in_chans"], side["img_size"]).numpy()
    np.testing.assert_allclose(session.run(None, {side["input"]: x})[0], EXPECTED["logits"], atol=1e-6)


@pytest.mark.parametrize("raw", [False, True])
def test_old_checkpoint_predicts_the_same(raw, capsys, monkeypatch):
    """`python predict.py` as a user runs it (the script run as __main__, in this process: a process of its own cost
    4 s, and tests/deployment/test_predict.py runs vit-predict as one); the raw probabilities through main()."""
    args = ["--ckpt", str(LEGACY / "model.ckpt"), "--format", "json", "--topk", "2", str(LEGACY / "images")]
    capsys.readouterr()
    if raw:
        from vit.commands.predict import main as predict_main

        assert predict_main([*args, "--raw-probs"]) == 0
    else:
        monkeypatch.setattr(sys, "argv", ["predict.py", *args])
        with pytest.raises(SystemExit) as done:
            runpy.run_path(str(Path(ROOT) / "predict.py"), run_name="__main__")
        assert done.value.code == 0
    got = json.loads(capsys.readouterr().out)
    for row in got:
        row["path"] = Path(row["path"]).name
        assert row.pop("unknown") is False  # a checkpoint from before rejection never says unknown
    assert got == EXPECTED["predict_json_raw_probs" if raw else "predict_json"]


def test_old_plan_yaml_repeats_its_run(tmp_path):
    for cls in ("across", "down"):  # the plan's folder: its classes, 8 images each (any images do)
        (tmp_path / "folder" / cls).mkdir(parents=True)
        for i in range(8):
            image = LEGACY / "images" / ("across00.png" if i % 2 else "down05.png")
            shutil.copy(image, tmp_path / "folder" / cls / f"{i}.png")
    args = ["fit", "--config", str(LEGACY / "plan.yaml"), "--data.init_args.root", str(tmp_path / "folder")]
    cli = fit_in(tmp_path, args + ["--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false"])
    assert type(cli.datamodule).__name__ == "ImageFolderDataModule"
    assert cli.model.hparams.arch["embed_dim"] == 16 and cli.trainer.current_epoch == 1
    assert list((tmp_path / "checkpoints").rglob("last.ckpt"))


@pytest.mark.parametrize(
    "old, name",
    [
        ("vit.datasets.TorchvisionDataModule", "TorchvisionDataModule"),  # configs/mnist.yaml before the split
        ("vit.streaming.StreamingDataModule", "StreamingDataModule"),  # configs/streaming.yaml before the split
        ("vit.data.ImageFolderDataModule", "ImageFolderDataModule"),  # every folder's plan.yaml
        ("vit.data.folder.ImageFolderDataModule", "ImageFolderDataModule"),
    ],
)
def test_class_paths_written_before_the_split_still_name_their_class(old, name):
    import importlib

    from jsonargparse._util import import_object

    import vit.data
    from vit.data.sources import public_class_path

    assert import_object(old) is getattr(vit.data, name)  # how LightningCLI resolves a config's class_path
    module, _, attr = old.rpartition(".")
    assert getattr(importlib.import_module(module), attr) is getattr(vit.data, name)  # how vit-eval does
    assert public_class_path(old) == f"vit.data.{name}"  # how the planner and the DDP memory budget compare them


def test_module_paths_of_before_the_split_import_with_a_warning_naming_the_new_one():
    """`from vit.interop import from_timm` (and every other top-level module of before the split) still works, and
    says where the module lives now."""
    import importlib

    from vit import RENAMED_MODULES

    for old, new in RENAMED_MODULES.items():
        sys.modules.pop(old, None)  # imported by an earlier test: its warning is asked for again
        with pytest.warns(DeprecationWarning, match=rf"^{old} is now {new}: import it from there$"):
            assert importlib.import_module(old) is importlib.import_module(new)
    with pytest.warns(DeprecationWarning, match="vit.interop is now vit.model.interop"):
        sys.modules.pop("vit.interop")
        from vit.interop import from_timm
    assert from_timm is importlib.import_module("vit.model.interop").from_timm
