"""Every fit says how long it will take (vit/run/estimate.py RunEstimate): after its first steps, and again when
the speed changes; and the steps after fit say what each took, the training images they read bounded by class."""

import re
import shutil

import pytest
import torch
from conftest import SMOKE, fit_in

from vit.data.base import by_class_sample
from vit.evaluation import after_fit
from vit.run import estimate

ARGS = ["fit", "--config", SMOKE, "--trainer.enable_progress_bar", "false", "--attention_maps.every_n_epochs", "0"]


def test_a_three_step_run_prints_its_estimate_with_steps_left_and_the_next_checkpoint(in_tmp, capsys):
    fit_in(in_tmp, [*ARGS, "--trainer.max_steps", "3"])
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("this recipe: "))
    assert re.search(r"this recipe: 3 steps, about \S+ \S+ on this machine \(cpu, \d+ cores; [\d.]+ s a step\); "
                     r"\d+ steps left: the end in ~\S+ \S+, the next checkpoint in ~", line), line  # fmt: skip


def test_a_hybrid_is_estimated_at_its_own_overhead_from_the_time_it_has_run(monkeypatch):
    """A hybrid's CNN dominates its step: its epochs ran at 0.99x the timed steps, where a small ViT's 1.2 promised a
    15-minute run 17 minutes; and the time run so far is the clock's (a frozen first epoch ran at half the speed)."""
    from types import SimpleNamespace

    from vit.planning.hybrid_plan import HYBRID_EPOCH_OVERHEAD
    from vit.planning.rules import EPOCH_OVERHEAD, FORWARD_SHARE

    def module(stem):
        return SimpleNamespace(device=torch.device("cpu"), hparams=SimpleNamespace(arch={"stem": stem}))

    assert estimate.epoch_overhead(module("tf_efficientnet_lite0")) == HYBRID_EPOCH_OVERHEAD < EPOCH_OVERHEAD
    assert estimate.epoch_overhead(module("patch")) == EPOCH_OVERHEAD
    clock = iter([100.0, 160.0])  # training starts at 100 s; the first line is printed at 160 s
    monkeypatch.setattr(estimate.RunEstimate, "_now", staticmethod(lambda pl_module, sync=True: next(clock)))
    trainer = SimpleNamespace(precision="32-true", num_training_batches=36, num_val_batches=[10], max_epochs=27,
                              estimated_stepping_batches=27 * 36, global_step=72, is_global_zero=False)  # fmt: skip
    run = estimate.RunEstimate()
    run.on_train_start(trainer, module("tf_efficientnet_lite0"))
    run._report(trainer, module("tf_efficientnet_lite0"), 0.8)
    left = 27 * 36 - 72  # 25 epochs: every step at 0.8 s, each epoch's validation at a third of a step a batch
    assert run.estimate_s == pytest.approx(60.0 + left * 0.8 * HYBRID_EPOCH_OVERHEAD + 25 * 10 * 0.8 * FORWARD_SHARE)


def test_a_change_of_speed_is_said_again(in_tmp, capsys, monkeypatch):
    monkeypatch.setattr(estimate, "RECHECK_STEPS", 2)
    clock, printed = [0.0], []

    def now(pl_module, sync=True):  # 1 s a call until the first line, then 10 s a call: a machine slowing down
        clock[0] += 10.0 if printed else 1.0
        return clock[0]

    say = estimate.RunEstimate._say
    monkeypatch.setattr(estimate.RunEstimate, "_now", staticmethod(now))
    monkeypatch.setattr(estimate.RunEstimate, "_say", lambda self, t, line: printed.append(line) or say(self, t, line))
    fit_in(in_tmp, ARGS)  # 2 epochs of 4 steps
    assert printed[0].startswith("this recipe: 2 epochs of 4 steps") and "0.50 s a step" in printed[0]
    again = [x for x in printed if x.startswith("estimate: now ")]
    assert again and again[0].startswith("estimate: now 5.00 s a step (10.0x); ") and "steps left" in again[0]


def test_each_step_after_fit_says_its_time_and_reads_a_bounded_sample_of_training_images(
    smoke_run, tmp_path, monkeypatch
):
    seen = []  # the batches each pass read
    features_of = after_fit.features_of
    monkeypatch.setattr(after_fit, "features_of", lambda m, b, d: seen.append(b.targets) or features_of(m, b, d))
    monkeypatch.setattr(after_fit, "TRAIN_IMAGES", 50)
    cli = smoke_run.cli
    # a copy: the steps write their records into the file, and the session's smoke run is read-only to tests
    copy = shutil.copy(smoke_run.root / "checkpoints" / "smoke" / "version_0" / "last.ckpt", tmp_path)
    lines = list(after_fit.after_fit_lines([str(copy)], cli.datamodule, cli.model.hparams, torch.device("cpu"),
                                           None, 0))  # fmt: skip
    assert lines and all(re.search(r" \[\d+\.\d s\]$", x) for x in lines), lines
    n_train = len(cli.datamodule.memory["train"][1])
    assert n_train > 50 and sorted(len(t) for t in seen)[0] == 50  # the training pass: the bound, not all of them
    assert any(len(t) == len(cli.datamodule.memory["val"][1]) for t in seen)  # every validation image


def test_the_training_images_after_fit_are_bounded_and_shared_by_class(monkeypatch):
    targets = torch.tensor([0] * 100 + [1] * 10 + [2] * 50)
    keep = by_class_sample(targets, 60, seed=0)
    assert torch.bincount(targets[keep]).tolist() == [25, 10, 25]  # the small class whole, the others an equal share
    assert torch.equal(keep, by_class_sample(targets, 60, seed=0)) and len(set(keep.tolist())) == 60
    assert len(by_class_sample(targets, 1000)) == 160
    soft = torch.nn.functional.one_hot(targets, 3).float()
    assert torch.equal(by_class_sample(soft, 30), by_class_sample(targets, 30))


def test_a_run_that_trained_on_few_images_reads_a_sample_of_validation_after_fit(smoke_run, tmp_path, monkeypatch):
    seen = []
    features_of = after_fit.features_of
    monkeypatch.setattr(after_fit, "features_of", lambda m, b, d: seen.append(len(b.targets)) or features_of(m, b, d))
    monkeypatch.setattr(after_fit, "VAL_FLOOR", 30)
    cli = smoke_run.cli
    copy = shutil.copy(smoke_run.root / "checkpoints" / "smoke" / "version_0" / "last.ckpt", tmp_path)
    n_val = len(cli.datamodule.memory["val"][1])
    assert n_val > 30
    measured = after_fit.measure_after_fit([str(copy)], cli.datamodule, torch.device("cpu"), trained=20)
    val, train = seen  # validation: max(VAL_FLOOR, 20), by class; training: the floor, an equal share of each class
    assert val == 30 and after_fit.TRAIN_FLOOR - 10 < train <= after_fit.TRAIN_FLOOR
    line = after_fit.calibration_lines(measured[str(copy)], cli.datamodule, None, 0)
    assert f"on 30 of the {n_val} validation images" in line
    seen.clear()
    copy2 = shutil.copy(copy, tmp_path / "again.ckpt")
    after_fit.measure_after_fit([str(copy2)], cli.datamodule, torch.device("cpu"), trained=10 * n_val)
    assert n_val in seen  # a run that trained on more images than validation holds reads all of it
