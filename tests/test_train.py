"""The training entry point end to end: configs parse, `fit` runs, checkpoints load back, the loop learns."""

import re
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

import train
from vit.data.digits import DigitsDataModule
from vit.model.checkpoint import load_model
from vit.model.config import ViTConfig
from vit.training.module import ViTClassifier
from vit.training.schedules import warmup_cosine

CONFIGS = sorted(Path(__file__).parent.parent.joinpath("configs").rglob("*.yaml"))
assert len(CONFIGS) >= 18, "the config list comes from disk: an empty glob would test nothing"
SMOKE = str(Path(__file__).parent.parent / "configs" / "smoke.yaml")


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_every_config_parses(config, capsys):
    extra = ["--data.init_args.root", "some/images"] if config.name == "folder.yaml" else []
    base = ["--config", SMOKE] if config.parent.name == "variants" else []  # variants are deltas on a recipe
    with pytest.raises(SystemExit) as e:
        train.main(["fit", *base, "--config", str(config), *extra, "--print_config"])
    assert e.value.code == 0
    printed = capsys.readouterr().out
    assert re.search(r"class_path: vit\.(data|datasets|streaming)\.", printed) and "model:" in printed


def test_smoke_fit_writes_a_checkpoint_that_loads_back(smoke_run):
    cli, in_tmp = smoke_run.cli, smoke_run.root
    ckpt_dir = in_tmp / "checkpoints" / "smoke" / "version_0"
    last = ckpt_dir / "last.ckpt"
    assert last.is_file() and list(ckpt_dir.glob("best-epoch*.ckpt"))
    assert list((in_tmp / "logs" / "smoke" / "version_0").glob("events.out.tfevents.*"))
    model, hparams = load_model(last)  # weights_only: plain data
    assert hparams.class_names == [str(i) for i in range(10)] and hparams.img_size == 32
    x = torch.randn(5, 3, 32, 32)
    trained = cli.model.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x), trained(x), atol=0, rtol=0)
    # The data module's facts were linked into the model, not typed twice.
    assert cli.model.hparams.mean == list(cli.datamodule.mean)


def test_a_bad_value_is_one_line_naming_field_and_value(in_tmp, capsys):
    with pytest.raises(SystemExit) as e:
        train.main(["fit", "--config", SMOKE, "--model.arch.patch_size", "5"])
    assert str(e.value) == "error: img_size=32 is not divisible by patch_size=5"
    # a usage error: exit 2, as argparse's and the other vit-* commands', the line on stderr
    assert e.value.code == 2 and capsys.readouterr().err.strip().endswith(str(e.value))


def test_warmup_then_cosine():
    f = warmup_cosine(warmup_steps=10, total_steps=110, min_ratio=0.01)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.01 + 0.99 * 0.5)
    assert f(110) == pytest.approx(0.01)


def test_without_layer_decay_two_param_groups_one_fused_kernel_each():
    module = ViTClassifier(arch=ViTConfig(embed_dim=32, depth=3, num_heads=2), weight_decay=0.05)
    module.trainer = type("T", (), {"estimated_stepping_batches": 100, "max_epochs": 10})()
    opt = module.configure_optimizers()["optimizer"]
    assert sorted(g["weight_decay"] for g in opt.param_groups) == [0.0, 0.05]
    assert opt.defaults["fused"] and sum(len(g["params"]) for g in opt.param_groups) == len(list(module.parameters()))


def test_no_weight_decay_on_norms_biases_and_embeddings_and_layer_decay():
    module = ViTClassifier(arch=ViTConfig(embed_dim=32, depth=2, num_heads=2), lr=1.0, layer_decay=0.5)
    module.trainer = type("T", (), {"estimated_stepping_batches": 100, "max_epochs": 10})()
    opt = module.configure_optimizers()["optimizer"]
    names = {id(p): n for n, p in module.model.named_parameters()}
    no_decay = {names[id(p)] for g in opt.param_groups if g["weight_decay"] == 0.0 for p in g["params"]}
    decay = [p for g in opt.param_groups if g["weight_decay"] == 0.05 for p in g["params"]]
    assert no_decay >= {"pos_embed", "norm.weight", "head.bias", "blocks.0.attn.qkv.bias"}
    assert all(p.ndim in (2, 4) for p in decay) and len(decay) + len(no_decay) == len(names)
    lr = {names[id(p)]: g["initial_lr"] for g in opt.param_groups for p in g["params"]}  # before the schedule
    # depth 2: embeddings 0.5^3, block 0 0.5^2, block 1 0.5, head 1
    assert (lr["pos_embed"], lr["blocks.0.mlp.fc1.weight"], lr["blocks.1.mlp.fc1.weight"], lr["head.weight"]) == (
        0.125,
        0.25,
        0.5,
        1.0,
    )


def test_a_tiny_vit_learns_digits(in_tmp):
    """Correctness of the whole loop (data, model, loss, optimizer, schedule): not a speed test."""
    L.seed_everything(0)
    model = ViTClassifier(arch=ViTConfig(patch_size=8, embed_dim=64, depth=2, num_heads=2), lr=2e-3, warmup_epochs=1)
    trainer = L.Trainer(
        max_epochs=12, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
    )
    trainer.fit(model, datamodule=DigitsDataModule(batch_size=32, crop_padding=0))
    acc = trainer.callback_metrics["val/acc"].item()
    assert acc >= 0.90, acc


def test_a_missing_data_folder_is_one_line(in_tmp):
    folder = str(Path(__file__).parent.parent / "configs" / "folder.yaml")
    with pytest.raises(SystemExit) as e:
        train.main(["fit", "--config", folder, "--data.root", str(in_tmp / "nope")])
    assert str(e.value) == f"error: data.root='{in_tmp / 'nope'}' is not a folder"


def test_fit_trains_on_a_folder_of_mixed_images(in_tmp):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c, mode in (("a", "L"), ("b", "RGBA"), ("c", "P")):
        (in_tmp / "imgs" / c).mkdir(parents=True)
        for i in range(6):
            img = Image.fromarray(rng.integers(0, 255, (20 + i, 30, 3), dtype=np.uint8)).convert(mode)
            img.save(in_tmp / "imgs" / c / f"{i}.png")
    folder = str(Path(__file__).parent.parent / "configs" / "folder.yaml")
    cli = train.main(
        [
            "fit",
            "--config",
            folder,
            "--data.root",
            str(in_tmp / "imgs"),
            "--trainer.max_epochs",
            "1",
            "--data.init_args.num_workers",
            "0",
            "--data.init_args.batch_size",
            "4",
            "--model.arch.depth",
            "1",
            "--trainer.enable_progress_bar",
            "false",
        ]
    )
    assert cli.model.hparams.class_names == ["a", "b", "c"]
    assert (in_tmp / "checkpoints" / "folder" / "version_0" / "last.ckpt").is_file()


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["--model.arch.depth", "abc"],
            "error: Parser key \"model.arch.depth\": Expected a <class 'int'>. Got value: abc",
        ),
        (["--model.foo", "3"], "error: unrecognized arguments: --model.foo 3"),
        (["--model.arch.drop_path_rate", "-0.5"], "error: drop_path_rate=-0.5 must be in [0, 1)"),
        (["--model.arch.num_heads", "5"], "error: embed_dim=32 is not divisible by num_heads=5"),
        (["--data.init_args.batch_size", "0"], "error: batch_size=0 must be >= 1"),
    ],
)
def test_bad_configuration_fails_before_any_work_with_one_line(args, expected, in_tmp):
    with pytest.raises(SystemExit) as e:
        train.main(["fit", "--config", SMOKE, *args])
    message = str(e.value)
    assert message.startswith(expected) and "\n" not in message
    assert not (in_tmp / "checkpoints").exists() and not (in_tmp / "logs").exists()


# The host-read check of the training step: tests/training/test_host_reads.py (every aten op, every option).


def _train_py(cwd, *args: str) -> subprocess.CompletedProcess:
    script = Path(__file__).parent.parent / "train.py"
    return subprocess.run([sys.executable, str(script), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


# `python train.py` / `vit-train` exits 0 through the interpreter's teardown (a user's atexit handler runs) and loses
# nothing: tests/test_package.py, in the same fresh process that runs the installed vit-train.


def test_bare_train_py_trains_cifar10_and_offline_says_where_to_put_it(in_tmp):
    """No subcommand and no config: fit configs/cifar10.yaml. With no network and no data/, one line says which
    archive to put where and that `make train` is the offline demo. (This machine has no network; where it has, the
    download may begin instead: then we only check that it got as far as looking for CIFAR.)"""
    run = _train_py(in_tmp)
    last = run.stderr.strip().splitlines()[-1]
    if run.returncode != 0:
        assert run.returncode == 2, run.returncode  # a command-line error's code
        assert last.startswith("error: cifar10 not found in data/ and not downloadable"), last
        assert "put cifar-10-python.tar.gz" in last and "make train" in last
        # found before the Trainer is built: nothing of Lightning's (seed, devices, advertisements) comes before it
        assert (run.stdout + run.stderr).strip().splitlines() == [last]
    else:
        assert "cifar" in (run.stdout + run.stderr).lower()


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], ["fit", "--config", "configs/cifar10.yaml"]),
        (["--config", "x.yaml"], ["fit", "--config", "x.yaml"]),
        (["fit", "--config", "x.yaml"], ["fit", "--config", "x.yaml"]),
        (["--data.root", "imgs"], ["fit", "--config", "configs/folder.yaml", "--data.root", "imgs"]),
        (["validate", "--config", "x.yaml"], ["validate", "--config", "x.yaml"]),
        (["--help"], ["--help"]),
    ],
)
def test_default_subcommand_and_config(argv, expected):
    out = train.normalize_args(argv)
    # packaged configs resolve to a real file; an unknown path is left for jsonargparse to report
    assert [a if not a.endswith(".yaml") or a == "x.yaml" else "configs/" + Path(a).name for a in out] == expected
    assert all(Path(a).is_file() for a in out if a.endswith(".yaml") and a != "x.yaml")


def test_an_old_flat_architecture_key_names_its_new_place(in_tmp):
    (in_tmp / "old.yaml").write_text("model:\n  embed_dim: 32\n")
    for args in (["--config", SMOKE, "--config", "old.yaml"], ["--config", SMOKE, "--model.embed_dim", "32"]):
        with pytest.raises(SystemExit) as e:
            train.main(args)
        assert "model.embed_dim is now model.arch.embed_dim" in str(e.value)


def test_help_shows_each_architecture_field_with_its_meaning(capsys):
    from vit.model.config import ViTConfig

    with pytest.raises(SystemExit):
        train.main(["fit", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert all(
        f"--model.arch.{name}" in out
        for name in ViTConfig.fields()
        if name not in ("img_size", "in_chans", "num_classes")
    )  # linked from the data
    assert "Normalise q and k per head before the dot product" in out  # the docstring under the field


def test_warmup_longer_than_the_schedule_is_corrected_with_a_warning():
    from vit.training.schedules import schedule_warmup

    with pytest.warns(
        UserWarning, match=r"warmup_epochs=5 is not shorter than the schedule \(max_epochs=3, 30 steps\)"
    ):
        assert schedule_warmup(5, 10.0, 30, 3) == 3  # a tenth, then cosine
    assert schedule_warmup(1, 10.0, 30, 3) == 10  # a warmup that fits is left alone


def test_max_time_warns_that_the_schedule_may_not_complete(monkeypatch):
    module = ViTClassifier(arch=ViTConfig(embed_dim=32, depth=1, num_heads=2))
    trainer = L.Trainer(max_time="00:00:01:00", max_epochs=5, logger=False, enable_checkpointing=False)
    module.trainer = trainer
    monkeypatch.setattr(L.Trainer, "estimated_stepping_batches", property(lambda self: 50))  # no data attached
    with pytest.warns(UserWarning, match="max_time can stop training before the learning-rate schedule"):
        module.configure_optimizers()


@pytest.mark.parametrize(
    "flags",
    [
        ["--trainer.logger", "false"],
        ["--trainer.enable_checkpointing", "false"],
        ["--trainer.logger", "false", "--trainer.enable_checkpointing", "false"],
        ["--attention_maps.every_n_epochs", "0"],
        ["--trainer.fast_dev_run", "true"],
        ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"],
    ],
    ids=["no-logger", "no-checkpoints", "neither", "no-attention-maps", "fast-dev-run", "quiet"],
)
def test_documented_off_switches_train_and_leave_out_what_needs_them(flags, in_tmp, capsys):
    """Each of Lightning's usual 'off' flags trains and exits normally; what depends on the switched-off part (the
    learning-rate monitor and attention maps on the logger, the mid-epoch checkpoint on checkpointing) is left out,
    and nothing lands in the working folder that the flags said not to write."""
    train.main(["fit", "--config", SMOKE, *flags])
    out = capsys.readouterr().out
    written = {p.name for p in in_tmp.iterdir()}
    ckpts = list(in_tmp.glob("checkpoints/**/*.ckpt"))
    if "--trainer.logger" in flags:
        assert "logs" not in written and "config.yaml" not in written  # no config.yaml dropped in the cwd either
    if "--trainer.enable_checkpointing" in flags or "--trainer.fast_dev_run" in flags:
        assert ckpts == [] and "val/acc" in out and "no checkpoint written" in out
    else:
        assert {p.name for p in ckpts} >= {"last.ckpt"} and "best val/acc" in out
    if flags == ["--attention_maps.every_n_epochs", "0"] or flags[0] == "--trainer.enable_progress_bar":
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        ea = EventAccumulator(str(in_tmp / "logs" / "smoke" / "version_0"), size_guidance={"images": 0})
        ea.Reload()
        assert len(ea.Scalars("val/acc")) == 2
        has_maps = any(t.startswith("attention/") for t in ea.Tags()["images"])
        assert has_maps == (flags[0] != "--attention_maps.every_n_epochs")


def test_an_off_switch_that_makes_no_sense_is_one_line(in_tmp):
    with pytest.raises(SystemExit, match="every_n_epochs=-1 must be >= 0"):
        train.main(["fit", "--config", SMOKE, "--attention_maps.every_n_epochs", "-1"])


def test_ema_weights_are_validated_and_saved(in_tmp):
    """--model.ema_decay: the checkpoint's weights (what predict, export and serve load) are the moving average,
    the raw weights ride along for resuming, and the average lies between the start and the raw end point."""
    cli = train.main(["fit", "--config", SMOKE, "--model.ema_decay", "0.5", "--attention_maps.every_n_epochs", "0"])
    ckpt = torch.load(in_tmp / "checkpoints" / "smoke" / "version_0" / "last.ckpt", weights_only=True)
    ema, raw = ckpt["state_dict"], ckpt["current_model_state"]
    key = "model.head.weight"
    assert not torch.equal(ema[key], raw[key])  # two different sets of weights
    torch.testing.assert_close(cli.model.model.head.weight.detach(), ema[key])  # after fit the module holds it
    model, _ = load_model(in_tmp / "checkpoints" / "smoke" / "version_0" / "last.ckpt")
    torch.testing.assert_close(model.head.weight, ema[key])  # what the commands load: the average
    with pytest.raises(SystemExit, match="ema_decay=1.0 must be in"):
        train.main(["fit", "--config", SMOKE, "--model.ema_decay", "1.0"])


def test_a_fixed_recipe_prints_its_estimated_wall_time_before_the_first_epoch_ends(smoke_run):
    """The smoke run (2 epochs of 4 steps): one line with the whole run's estimate, before the first validation."""
    from vit.run.estimate import RunEstimate

    estimate = next(cb for cb in smoke_run.cli.trainer.callbacks if isinstance(cb, RunEstimate))
    assert estimate.estimate_s is not None and 0 < estimate.estimate_s < 600


def test_the_estimate_line_names_epochs_time_and_a_way_out(in_tmp, capsys):
    from conftest import SMOKE, fit_in

    fit_in(in_tmp, ["fit", "--config", SMOKE, "--trainer.enable_progress_bar", "false", "--trainer.max_epochs", "1",
                    "--trainer.logger", "false"])  # fmt: skip
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("this recipe: "))
    assert line.startswith("this recipe: 1 epochs of 4 steps, about ") and "on this machine (cpu, " in line


@pytest.mark.parametrize("bf16_speed", [10.0, 300.0])
def test_bf16_on_a_cpu_where_it_measures_slower_is_said_before_training_and_in_the_estimate(
    bf16_speed, in_tmp, capsys, monkeypatch
):
    from conftest import SMOKE, fit_in

    speeds = {"32-true": 100.0, "bf16-mixed": bf16_speed}  # images/s of the timed steps
    monkeypatch.setattr("vit.planning.precision.native_bf16_cpu", lambda: True)  # else the flags answer untimed
    checked = []
    monkeypatch.setattr(
        "vit.planning.speed.calibrate",
        lambda archs, batch, device, precision, **kw: checked.append(precision) or [speeds[precision]],
    )
    args = ["fit", "--config", SMOKE, "--trainer.enable_progress_bar", "false", "--trainer.logger", "false"]
    fit_in(in_tmp, [*args, "--trainer.precision", "bf16-mixed", "--trainer.max_epochs", "2"])  # 8 steps
    assert checked == ["32-true", "bf16-mixed"]
    lines = capsys.readouterr().out.splitlines()
    note = "bf16-mixed measured 10.0x slower than fp32 on this CPU: --trainer.precision 32-true"
    estimate = next(x for x in lines if x.startswith("this recipe: "))
    if bf16_speed < 100:
        assert note in lines and lines.index(note) < lines.index(estimate) and estimate.endswith("; " + note)
    else:  # faster in bf16: nothing said
        assert not any("slower than fp32" in x for x in lines)


def test_a_bf16_the_rule_chose_is_not_timed_again_when_training_starts(in_tmp, capsys, monkeypatch):
    """`auto` on a CPU with native bf16 times both precisions once; the run's start does not time them again (a
    second timing at another batch once told a planned run that bf16, chosen 1.24x faster, was 1.1x slower)."""
    from conftest import SMOKE, fit_in

    speeds = {"32-true": 100.0, "bf16-mixed": 150.0}
    monkeypatch.setattr("vit.planning.precision.native_bf16_cpu", lambda: True)
    checked = []
    monkeypatch.setattr(
        "vit.planning.speed.calibrate",
        lambda archs, batch, device, precision, **kw: checked.append(precision) or [speeds[precision]],
    )
    args = ["fit", "--config", SMOKE, "--trainer.enable_progress_bar", "false", "--trainer.logger", "false"]
    cli = fit_in(in_tmp, [*args, "--trainer.precision", "auto", "--trainer.max_epochs", "2"])  # 8 steps
    assert str(cli.trainer.precision) == "bf16-mixed" and checked == ["32-true", "bf16-mixed"]
    assert not any("than fp32" in x for x in capsys.readouterr().out.splitlines())


def test_a_run_no_longer_than_the_bf16_check_is_not_checked(monkeypatch):
    """A smoke run of 4 steps would take as long again to time bf16 against fp32 (6 steps): it is left out."""
    from types import SimpleNamespace

    from vit.run.estimate import CHECK_STEPS, RunEstimate

    checked = []
    monkeypatch.setattr("vit.planning.speed.calibrate", lambda *a, **kw: checked.append(a) or [1.0])
    monkeypatch.setattr("vit.planning.precision.native_bf16_cpu", lambda: True)  # else the flags answer untimed
    module = SimpleNamespace(device=torch.device("cpu"), model=SimpleNamespace(cfg=None))
    for steps in (4, CHECK_STEPS, CHECK_STEPS + 1):
        trainer = SimpleNamespace(precision="bf16-mixed", estimated_stepping_batches=steps, is_global_zero=True)
        RunEstimate().on_train_start(trainer, module)
    assert len(checked) == 2  # fp32 and bf16, for the run of 7 steps only


def test_the_way_out_is_offered_past_an_hour():
    from types import SimpleNamespace

    from vit.run.estimate import RunEstimate

    trainer = SimpleNamespace(num_training_batches=390, num_val_batches=[40], max_epochs=200, is_global_zero=True)
    module = SimpleNamespace(device=torch.device("cpu"))
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        RunEstimate()._report(trainer, module, 2.1)
    line = buffer.getvalue().strip()
    assert line.startswith("this recipe: 200 epochs of 390 steps, about 56.2 h")  # 390 * 2.1 * 1.2 + 40 * 0.7 an epoch
    assert line.endswith("--trainer.max_epochs 3 fits in about an hour") and "--budget" not in line  # no data: no plan

    from vit.data.cifar import CIFARDataModule

    trainer.datamodule = CIFARDataModule.__new__(CIFARDataModule)  # a source the planner reads
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        RunEstimate()._report(trainer, module, 2.1)
    assert (
        "about 56.2 h on this machine" in buffer.getvalue()
        and "; --budget 1h plans a run that fits; " in buffer.getvalue()
    )


def test_runs_without_a_logger_keep_every_model_and_a_given_dirpath_is_honoured(in_tmp, capsys):
    """Two `--trainer.logger false` runs used to write checkpoints/default/last.ckpt over each other, and
    `--checkpoint.dirpath` / `--trainer.default_root_dir` were overwritten: each run now keeps its own files."""
    quick = ["--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false", "--trainer.logger", "false"]
    for _ in range(2):
        train.main(["fit", "--config", SMOKE, *quick])
    lasts = sorted(p.relative_to(in_tmp).as_posix() for p in in_tmp.glob("checkpoints/**/last.ckpt"))
    assert lasts == ["checkpoints/default/version_0/last.ckpt", "checkpoints/default/version_1/last.ckpt"]
    mine = ["--checkpoint.dirpath", "mine", "--trainer.default_root_dir", "elsewhere"]
    train.main(["fit", "--config", SMOKE, *quick, *mine])
    assert any(p.name.startswith("best") for p in (in_tmp / "mine").glob("*.ckpt"))  # the dirpath given
    assert list((in_tmp / "elsewhere" / "checkpoints" / "default" / "version_0").glob("last.ckpt"))  # the root given


def test_train_predict_is_refused_in_one_line_naming_vit_predict(in_tmp):
    with pytest.raises(SystemExit, match="error: vit-train predict is not a command here: .*vit-predict --ckpt"):
        train.main(["predict", "--config", SMOKE])
