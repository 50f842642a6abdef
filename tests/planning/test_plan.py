"""The planner (vit/planning/plan.py) and planned runs (vit/run/planned.py): the rule table on tiny, small and
large fingerprints, the budget arithmetic and its correction after the first epoch (fake clock), explicit fields
winning, and plan.yaml repeating the run."""

import logging
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from digits_folder import write_digits_folder
from fake_speeds import CPU2, speeds_by_tokens, speeds_like_2_cores

import train
from vit.planning.budget import parse_budget
from vit.planning.explicit import explicit_keys, is_explicit
from vit.planning.fingerprint import Fingerprint, mirror_symmetry
from vit.planning.plan import make_plan
from vit.planning.rules import MODELS
from vit.planning.speed import Machine
from vit.run.fit_budget import FitBudget
from vit.training.recipe import TrainingRecipe

GPU = Machine("cuda", 16, "H200", 139.0)
TINY_FLAGS = ["--model.arch.depth", "1", "--model.arch.embed_dim", "32", "--model.arch.num_heads", "2"]


def fp(n_train, n_val=None, classes=10, side=28, symmetry=0.3, gray=1.0, decode_s=5.0):
    n_val = n_train // 4 if n_val is None else n_val
    return Fingerprint(
        "data", n_train, n_val, [n_train // classes] * classes, side, side, side, gray, symmetry, decode_s
    )


def plan(f, machine=CPU2, budget=None, speed=speeds_like_2_cores):
    return make_plan(f, machine, budget_s=budget, elapsed_s=3.0, speed_fn=speed).overrides


def test_a_tiny_folder_gets_a_small_model_light_augmentation_and_small_batches():
    p = plan(fp(120, classes=3, side=20))
    assert (p["model.arch.embed_dim"], p["model.arch.depth"]) in [m[:2] for m in MODELS[:2]]
    assert p["data.init_args.batch_size"] == 120 // 8  # at least 8 steps per epoch
    assert p["data.init_args.crop_scale"] == [0.8, 1.0] and p["data.init_args.auto_augment"] == "none"
    assert p["model.mixup_alpha"] == 0 and p["data.init_args.random_erasing"] == 0
    assert (p["data.init_args.img_size"], p["model.arch.patch_size"]) == (20, 5)  # its own size, 16 tokens
    assert p["trainer.max_epochs"] == 60


def test_a_small_folder_of_digits_is_not_flipped_and_trains_at_its_own_size():
    p = plan(fp(8000, side=28, symmetry=0.49))
    assert p["data.init_args.hflip"] is False
    assert (p["data.init_args.img_size"], p["model.arch.patch_size"]) == (28, 7)  # 16 tokens of 7x7 pixels
    assert p["data.init_args.batch_size"] == 128
    assert p["trainer.max_epochs"] == 40


def test_a_large_colour_folder_on_a_gpu_gets_photo_augmentation_mixup_and_the_big_model():
    p = plan(fp(500_000, classes=100, side=96, symmetry=0.95, gray=0.0), machine=GPU)
    assert p["data.init_args.hflip"] is True
    assert p["data.init_args.auto_augment"] == "trivialaugment" and p["data.init_args.random_erasing"] > 0
    assert p["model.mixup_alpha"] > 0 and p["model.cutmix_alpha"] > 0
    assert (p["model.arch.embed_dim"], p["model.arch.depth"]) == MODELS[-1][:2]
    assert p["data.init_args.batch_size"] == 256
    assert p["model.arch.patch_size"] == 12 and p["data.init_args.img_size"] == 96  # 8x8 tokens


def test_cifar_sized_images_get_16_tokens_on_a_cpu_and_64_on_a_gpu():
    f = fp(50_000, side=32, symmetry=0.95, gray=0.0)
    assert plan(f)["model.arch.patch_size"] == 8 and plan(f, machine=GPU)["model.arch.patch_size"] == 4


def test_a_grayscale_large_folder_gets_no_colour_policy():
    assert plan(fp(100_000, gray=1.0))["data.init_args.auto_augment"] == "none"


def test_muon_where_it_was_measured_to_win_and_adamw_elsewhere():
    """30k-200k images: Muon for the blocks' matrices (docs/recipes.md, 3 seeds); the other tiers keep AdamW."""
    assert plan(fp(50_000))["model.optimizer"] == "muon"
    assert plan(fp(8000))["model.optimizer"] == plan(fp(1000))["model.optimizer"] == "adamw"
    assert plan(fp(500_000), machine=GPU)["model.optimizer"] == "adamw"


def test_patch_dropout_in_the_first_half_where_it_was_measured_to_win_and_nowhere_else():
    """30k-200k images: half the patch tokens dropped for the first half of the epochs (docs/recipes.md, 3 seeds)."""
    p = plan(fp(50_000))
    assert (p["model.arch.patch_drop_rate"], p["model.patch_drop_until"]) == (0.5, 0.5)
    for small in (plan(fp(8000)), plan(fp(1000)), plan(fp(500_000), machine=GPU)):
        assert small["model.arch.patch_drop_rate"] == 0.0 and small["model.patch_drop_until"] == 1.0
    rows = dict((name, value) for name, value, _ in make_plan(fp(50_000), CPU2, speed_fn=speeds_like_2_cores).rows)
    assert rows["patch dropout"] == "0.5 of the tokens, first 0.5 of the epochs"


@pytest.mark.parametrize("flags", [[], ["--model.arch.attn_pattern", "local"], ["--model.arch.rope", "true"]])
def test_a_planned_run_drops_patches_early_unless_the_attention_needs_every_token(
    flags, digits_folder, in_tmp, caplog, monkeypatch
):
    import logging

    import vit.planning.rules as rules

    # the digits folder's tier with the large tier's patch dropout: the real planned-run code path on small data
    tiers = [(*rules.TIERS[0][:-1], 0.5), *rules.TIERS[1:]]
    monkeypatch.setattr(rules, "TIERS", tiers)
    with caplog.at_level(logging.INFO):
        cli = train.main(
            [
                "fit",
                "--data.root",
                str(digits_folder),
                "--trainer.max_epochs",
                "2",
                "--trainer.enable_progress_bar",
                "false",
                *TINY_FLAGS,
                *flags,
            ]
        )
    drop = cli.model.model.patch_drop
    if flags:  # a local window or RoPE follows the patch grid: every token, and the plan says why
        assert drop is None and cli.model.hparams.arch["patch_drop_rate"] == 0.0
        assert "your attention pattern or RoPE needs every token" in caplog.text
    else:  # on for epoch 0 of 2, off for epoch 1 (the last state the module set)
        assert cli.model.hparams.arch["patch_drop_rate"] == 0.5 and cli.model.hparams.patch_drop_until == 0.5
        assert drop is not None and drop.prob == 0.0


def test_calibration_times_the_planned_optimizer(monkeypatch):
    import vit.planning.speed as plan_module

    steps = []
    real = plan_module.MuonWithAdamW.step
    monkeypatch.setattr(plan_module.MuonWithAdamW, "step", lambda self, *a: steps.append(1) or real(self, *a))
    cfg = plan_module.ViTConfig(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2)
    speeds = plan_module.calibrate([cfg], batch_size=4, optimizer="muon", steps=1, warmup=1)
    assert len(steps) == 2 and speeds[0] > 0
    plan_module.calibrate([cfg], batch_size=4, optimizer="adamw", steps=1, warmup=1)
    assert len(steps) == 2  # AdamW alone: no Muon step


@pytest.mark.parametrize("budget", [60, 120, 300, 900])
def test_the_planned_run_fills_the_budget_within_15_percent(budget):
    f = fp(8000)
    result = make_plan(f, CPU2, budget_s=budget, elapsed_s=3.0, speed_fn=speeds_like_2_cores)
    assert 0.85 * budget <= result.estimate_s <= budget, (result.estimate_s, budget)
    epochs = result.overrides["trainer.max_epochs"]
    assert 3.0 + f.decode_s + 8.0 + epochs * result.epoch_s == pytest.approx(result.estimate_s)


def test_a_bigger_budget_buys_a_bigger_model_and_more_epochs():
    small = plan(fp(8000), budget=120)
    large = plan(fp(8000), budget=1200)
    assert large["model.arch.embed_dim"] > small["model.arch.embed_dim"]
    assert large["trainer.max_epochs"] >= small["trainer.max_epochs"]


def test_a_budget_too_short_to_train_is_refused_with_the_minimum():
    with pytest.raises(ValueError, match=r"budget=15s is too short for data: .* give at least \d+s"):
        make_plan(fp(8000), CPU2, budget_s=15, elapsed_s=3.0, speed_fn=speeds_like_2_cores)


def test_budgets_parse_like_a_person_writes_them():
    assert parse_budget("5min") == 300 and parse_budget("300s") == 300 and parse_budget("1.5h") == 5400
    assert parse_budget("90") == 90 and parse_budget("00:00:05:00") == 300 and parse_budget({"minutes": 2}) == 120
    assert parse_budget(None) is None
    for bad in ("soon", "-5min", "0s"):
        with pytest.raises(ValueError, match="budget="):
            parse_budget(bad)


def test_mirror_symmetry_tells_handed_classes_from_mirror_symmetric_ones():
    g = torch.Generator().manual_seed(0)
    base = torch.rand(4, 16, 16, generator=g)
    handed = [(base[c] * 255).to(torch.uint8).expand(3, -1, -1) for c in range(4) for _ in range(5)]
    sym = [((base[c] + base[c].flip(-1)) * 127).to(torch.uint8).expand(3, -1, -1) for c in range(4) for _ in range(5)]
    labels = [c for c in range(4) for _ in range(5)]
    assert mirror_symmetry(sym, labels) > 0.99
    assert mirror_symmetry(handed, labels) < 0.3


def test_turn_symmetry_tells_classes_that_keep_under_quarter_turns_from_upright_ones():
    g = torch.Generator().manual_seed(0)
    base = torch.rand(4, 16, 16, generator=g)
    # the mean of the four turns of a pattern is the same pattern turned: a class that any turn leaves in itself
    turned = torch.stack([sum(torch.rot90(base[c], k, (-2, -1)) for k in range(4)) / 4 for c in range(4)])
    # a mirror-symmetric but upright pattern (a shirt): flips keep it, turns do not
    upright = (base + base.flip(-1)) / 2
    labels = [c for c in range(4) for _ in range(5)]
    as_images = lambda t: [(t[c] * 255).to(torch.uint8).expand(3, -1, -1) for c in range(4) for _ in range(5)]  # noqa
    assert mirror_symmetry(as_images(turned), labels, turn=True) > 0.99
    assert mirror_symmetry(as_images(upright), labels) > 0.99
    assert mirror_symmetry(as_images(upright), labels, turn=True) < 0.3


def test_turns_are_planned_only_for_classes_that_keep_under_them():
    upright = fp(8000, side=28, symmetry=0.49)
    turnable = fp(1500, classes=2, side=300, symmetry=0.99)
    turnable.turn_symmetry = 0.98
    assert plan(upright)["data.init_args.rot90"] is False
    p = plan(turnable)
    assert p["data.init_args.rot90"] is True and p["data.init_args.hflip"] is True


class FakeTrainer:
    """What FitBudget reads and writes of a Trainer: 10 steps per epoch, a LambdaLR over two parameter groups."""

    def __init__(self, max_epochs, module):
        self.fit_loop = SimpleNamespace(max_epochs=max_epochs)
        self.strategy = SimpleNamespace(broadcast=lambda obj, src=0: obj)  # one process
        self.current_epoch = 0
        opt = torch.optim.AdamW([{"params": [torch.zeros(1)]}, {"params": [torch.zeros(1)]}])
        from vit.training.schedules import warmup_cosine

        sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(10, 10 * max_epochs, 0.01))
        self.lr_scheduler_configs = [SimpleNamespace(scheduler=sched)]

    @property
    def max_epochs(self):
        return self.fit_loop.max_epochs

    @property
    def estimated_stepping_batches(self):
        return 10 * self.max_epochs


@pytest.mark.parametrize("real_epoch_s", [2.0, 5.0, 9.0])
def test_the_budget_correction_after_one_epoch_ends_the_run_on_time(real_epoch_s):
    """Planned: 20 epochs of 5 s in a 110 s budget (10 s spent). Really an epoch takes real_epoch_s: the run is resized
    after the first so that it ends within 15% of the deadline, with a complete cosine schedule."""
    now = [10.0]
    saved = []
    module = SimpleNamespace(recipe=TrainingRecipe(warmup_epochs=1, min_lr_ratio=0.01))
    trainer = FakeTrainer(20, module)
    cb = FitBudget(deadline=110.0, cap=100, on_change=saved.append, clock=lambda: now[0], teardown_s=0.0)
    # planned: 20 epochs of 5 s after 10 s; the 10% reserve makes a 5-s epoch plan 18
    cb.on_train_epoch_start(trainer, module)
    now[0] += real_epoch_s
    trainer.current_epoch = 1
    cb.on_train_epoch_start(trainer, module)
    end = 10.0 + trainer.max_epochs * real_epoch_s
    assert 0.85 * 110 <= end <= 110, (trainer.max_epochs, end)
    assert saved == ([trainer.max_epochs] if trainer.max_epochs != 20 else [])
    lam = trainer.lr_scheduler_configs[0].scheduler.lr_lambdas
    total = 10 * trainer.max_epochs
    assert len(lam) == 2 and lam[0](total) == pytest.approx(0.01) and lam[0](total - 20) > 0.01  # cosine ends at total
    assert lam[0](5) == pytest.approx(0.6)  # the first epoch (warmup) is unchanged


def test_a_run_that_stops_at_the_plans_most_epochs_says_so_and_what_it_leaves(caplog):
    """A plan asks the budget to spend itself, and to say why when it stops early: 5-s epochs in a 200-s budget would
    fit 35, the cap is 12, so the resize says the cap and the ~140 s it leaves; a resize under the cap says nothing."""
    module = SimpleNamespace(recipe=TrainingRecipe(warmup_epochs=1, min_lr_ratio=0.01))
    lines, now = [], [0.0]
    for cap in (12, 100):
        now[0], trainer = 0.0, FakeTrainer(10, module)
        cb = FitBudget(deadline=200.0, cap=cap, clock=lambda: now[0], teardown_s=0.0)
        with caplog.at_level(logging.INFO):
            for epoch in (0, 1):
                trainer.current_epoch = epoch
                cb.on_train_epoch_start(trainer, module)
                now[0] += 5.0
        lines.append(caplog.records[-1].getMessage())
    assert trainer.max_epochs == 36 and "most epochs" not in lines[1]
    assert "so 12 epochs instead of 10" in lines[0] and lines[0].endswith(
        "(12, the plan's most epochs: ~140 s of the budget left unspent)"
    )


def test_explicit_keys_come_from_flags_and_config_files(tmp_path):
    cfg = tmp_path / "mine.yaml"
    cfg.write_text("model:\n  arch:\n    depth: 2\ndata:\n  init_args:\n    hflip: true\n")
    keys = explicit_keys(["--data.root", "x", "--model.lr=0.01", "--trainer.callbacks+=a.B"], [cfg])
    assert {"data.init_args.root", "model.lr", "model.arch.depth", "data.init_args.hflip", "trainer.callbacks"} <= keys
    assert is_explicit("model.arch.depth", keys) and not is_explicit("model.arch.embed_dim", keys)
    assert is_explicit("model.arch.embed_dim", {"model.arch"})  # a whole dict given at once


def test_a_shipped_recipe_is_planned_over_and_your_copy_of_it_wins(tmp_path):
    """`python train.py --budget 30min` reads configs/cifar10.yaml for its data: its recipe fields are the plan's to
    replace. The same file copied into your project is your choice, and a variant added on top stays yours."""
    shipped = Path(train.__file__).resolve().parent / "configs" / "cifar10.yaml"
    assert explicit_keys([], [shipped]) == set()
    (tmp_path / "cifar10.yaml").write_text(shipped.read_text())
    assert "trainer.max_epochs" in explicit_keys([], [tmp_path / "cifar10.yaml"])
    variant = shipped.parent / "variants" / "gqa.yaml"
    assert "model.arch.num_kv_heads" in explicit_keys([], [shipped, variant])


@pytest.fixture(scope="module")
def digits_folder(tmp_path_factory):
    return write_digits_folder(tmp_path_factory.mktemp("digits"), limit=400, val_size=80)


def _state(ckpt: Path) -> dict:
    return torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]


def test_a_folder_run_plans_yours_win_and_plan_yaml_repeats_it(digits_folder, in_tmp):
    (in_tmp / "mine.yaml").write_text("model:\n  arch:\n    depth: 1\n")
    flags = ["--trainer.max_epochs", "2", "--model.lr", "0.003", "--trainer.enable_progress_bar", "false"]
    args = ["--config", "configs/folder.yaml", "--config", "mine.yaml", "--data.root", str(digits_folder)]
    cli = train.main(["fit", *args, *flags])
    arch = cli.model.hparams.arch
    assert arch["depth"] == 1 and cli.model.hparams.lr == 0.003 and cli.trainer.max_epochs == 2  # yours
    assert (arch["img_size"], arch["patch_size"]) == (24, 6) and not cli.datamodule.augmentation.hflip  # planned
    assert cli.model.hparams.label_smoothing == 0.1 and cli.datamodule.augmentation.rrc_scale == (0.8, 1.0)
    plan_file = in_tmp / "logs" / "folder" / "version_0" / "plan.yaml"
    saved = yaml.safe_load(plan_file.read_text())
    assert (
        saved["plan"] is False and saved["budget"] is None and saved["model"]["arch"]["embed_dim"] == arch["embed_dim"]
    )
    # the table shows your values in the rows they replace, beside the plan's: the run trains with yours
    rows = {line[1:].split()[0]: line for line in plan_file.read_text().splitlines() if line.startswith("#   ")}
    assert "-> yours: depth=1" in rows["model"] and "the plan's:" in rows["model"], rows["model"]
    assert "-> yours: max_epochs=2" in rows["epochs"]
    assert "-> yours: lr=0.003, warmup_epochs=1" in rows["batch,"]  # the warmup follows your epochs (at least 1)
    assert "yours" not in rows["img_size,"] and "model.arch.depth=1" in rows["yours"]
    first = _state(in_tmp / "checkpoints" / "folder" / "version_0" / "last.ckpt")

    again = train.main(["fit", "--config", str(plan_file), "--trainer.enable_progress_bar", "false"])
    assert again.model.hparams == cli.model.hparams
    second = _state(in_tmp / "checkpoints" / "folder" / "version_1" / "last.ckpt")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)  # the same run, weight for weight
    assert not (in_tmp / "logs" / "folder" / "version_1" / "plan.yaml").exists()  # no planning the second time


def test_budget_on_a_fixed_recipe_or_a_bad_budget_is_one_line(in_tmp, digits_folder):
    with pytest.raises(
        SystemExit, match=r"error: --budget and plan: true plan a folder .*; not vit.data.DigitsDataModule"
    ):
        train.main(["fit", "--config", "configs/digits.yaml", "--budget", "1min"])
    with pytest.raises(SystemExit, match=r"error: budget='soon': expected a duration such as 300s, 5min or 1.5h"):
        train.main(["fit", "--data.root", str(digits_folder), "--budget", "soon"])
    with pytest.raises(SystemExit, match=r"error: ckpt_path=last: resume a planned run from its saved plan"):
        train.main(["fit", "--data.root", str(digits_folder), "--ckpt_path", "last"])


def test_a_budget_resizes_the_run_and_rewrites_plan_yaml(digits_folder, in_tmp, monkeypatch):
    """A real run with a budget: FitBudget is on, and when it resizes, plan.yaml says the new epoch count."""
    import vit.run.planned as pr

    resized = []
    original = pr.FitBudget.resize

    def resize(self, trainer, pl_module, epochs, epoch_s, note=""):
        epochs = 3  # what a shorter real epoch would give; the rest is the real code path
        resized.append(epochs)
        original(self, trainer, pl_module, epochs, epoch_s, note)

    monkeypatch.setattr(pr.FitBudget, "resize", resize)
    cli = train.main(
        [
            "fit",
            "--data.root",
            str(digits_folder),
            "--budget",
            "2h",
            "--trainer.enable_progress_bar",
            "false",
            "--model.arch.depth",
            "1",
            "--model.arch.embed_dim",
            "32",
            "--model.arch.num_heads",
            "2",
        ]
    )
    assert resized == [3] and cli.trainer.current_epoch == 3
    saved = yaml.safe_load((in_tmp / "logs" / "folder" / "version_0" / "plan.yaml").read_text())
    assert saved["trainer"]["max_epochs"] == 3 and saved["trainer"]["max_time"] is None
    assert math.isclose(cli.trainer.lr_scheduler_configs[0].scheduler.get_last_lr()[0], 0.002 * 0.01, rel_tol=1e-6)


def test_max_time_is_taken_as_the_budget_instead_of_a_cut(digits_folder, in_tmp, caplog):
    import logging

    with caplog.at_level(logging.INFO):
        cli = train.main(
            [
                "fit",
                "--data.root",
                str(digits_folder),
                "--trainer.max_time",
                "00:01:00:00",
                "--trainer.max_epochs",
                "1",
                "--trainer.enable_progress_bar",
                "false",
                *TINY_FLAGS,
            ]
        )
    assert not any(type(cb).__name__ == "Timer" for cb in cli.trainer.callbacks)  # no cut mid-schedule
    assert "budget 3600 s" in caplog.text and "plan for" in caplog.text


def test_with_two_warmup_epochs_both_are_timed():
    """Two timed epochs (here 6 s and 2 s, the first with one-time costs): their mean sizes the run."""
    now = [0.0]
    module = SimpleNamespace(recipe=TrainingRecipe(warmup_epochs=2, min_lr_ratio=0.01))
    trainer = FakeTrainer(50, module)
    cb = FitBudget(deadline=200.0, cap=100, clock=lambda: now[0], teardown_s=0.0)
    for epoch, took in ((0, 6.0), (1, 2.0)):
        trainer.current_epoch = epoch
        cb.on_train_epoch_start(trainer, module)
        assert trainer.max_epochs == 50  # nothing decided while timing
        now[0] += took
    trainer.current_epoch = 2
    cb.on_train_epoch_start(trainer, module)
    end = now[0] + (trainer.max_epochs - 2) * 4.0  # epochs as long as the two timed ones on average
    assert 0.85 * 200 <= end <= 200, (trainer.max_epochs, end)


@pytest.mark.parametrize("field", ["freeze_stem_epochs", "freeze_backbone_epochs"])
def test_frozen_epochs_are_not_timed(field):
    """A first epoch with frozen parameters skips their backward pass (here 3 s against the others' 8 s): timing it
    would size the run for 3-s epochs. Nothing is decided after it; the first epoch that trains everything is timed,
    and the run then ends on time."""
    now = [0.0]
    module = SimpleNamespace(recipe=TrainingRecipe(warmup_epochs=1, min_lr_ratio=0.01, **{field: 1}))
    trainer = FakeTrainer(20, module)
    cb = FitBudget(deadline=200.0, cap=100, clock=lambda: now[0], teardown_s=0.0)
    for epoch, took in ((0, 3.0), (1, 8.0)):
        trainer.current_epoch = epoch
        cb.on_train_epoch_start(trainer, module)
        assert trainer.max_epochs == 20  # nothing decided while the frozen epoch and the first full one run
        now[0] += took
    trainer.current_epoch = 2
    cb.on_train_epoch_start(trainer, module)
    end = now[0] + (trainer.max_epochs - 2) * 8.0
    assert trainer.max_epochs == 23 and 0.85 * 200 <= end <= 200, (trainer.max_epochs, end)
    lam = trainer.lr_scheduler_configs[0].scheduler.lr_lambdas[0]
    assert lam(10 * 23) == pytest.approx(0.01) and lam(5) == pytest.approx(0.6)  # the cosine ends at the new total


def test_precision_is_measured_on_the_chosen_model_and_bf16_taken_only_where_faster():
    """bf16 autocast where the machine runs it faster (a GPU, a CPU with AMX), fp32 where it is slower; the epochs
    that fit the budget follow the measured speed."""
    slower = make_plan(fp(50_000), CPU2, budget_s=900, elapsed_s=3.0, speed_fn=speeds_like_2_cores)
    asked = []

    def bf16_twice_as_fast(archs, batch, precision="32-true"):
        asked.append((len(archs), precision))
        return [s * (2.0 if precision == "bf16-mixed" else 1.0) for s in speeds_like_2_cores(archs, batch)]

    faster = make_plan(fp(50_000), CPU2, budget_s=900, elapsed_s=3.0, speed_fn=bf16_twice_as_fast)
    assert slower.overrides["trainer.precision"] == "32-true"
    assert faster.overrides["trainer.precision"] == "bf16-mixed" and asked[-1] == (1, "bf16-mixed")
    same_model = faster.overrides["model.arch.embed_dim"] == slower.overrides["model.arch.embed_dim"]
    assert not same_model or faster.overrides["trainer.max_epochs"] > slower.overrides["trainer.max_epochs"]
    assert any(row[0] == "precision" and "bf16" in row[2] for row in faster.rows)


def test_the_token_grid_takes_the_images_own_size_when_it_divides_it():
    from vit.planning.rules import resolution

    assert resolution(28) == (28, 7) and resolution(24) == (24, 6) and resolution(20) == (20, 5)
    assert resolution(30) == (32, 8) and resolution(27) == (32, 8) and resolution(10) == (16, 4)  # listed sides
    assert resolution(28, "cuda") == (32, 4) and resolution(64, "cuda") == (64, 8)


@pytest.mark.parametrize("budget, grid", [(300, (32, 8)), (900, (32, 8)), (8 * 3600, (64, 8))])
def test_64_px_images_get_16_tokens_in_a_short_budget_and_their_own_64_when_the_whole_recipe_fits(budget, grid):
    """MNIST-sized folders of 64-px images: the 8x8 grid at 64 px only when the tier's largest model trains its
    wanted epochs in the budget at 64 tokens; otherwise 32 px with patch 8 (16 tokens, four times the epochs)."""
    p = plan(fp(8000, side=64), budget=budget, speed=speeds_by_tokens)
    assert (p["data.init_args.img_size"], p["model.arch.patch_size"]) == grid


@pytest.mark.parametrize("n, budget", [(8000, 300), (50_000, 900), (1437, 180)])
def test_the_measured_28_px_and_digit_plans_keep_their_16_tokens(n, budget):
    """The tiers measured at 28 px (MNIST 5 min, Fashion-MNIST 15 min) and the digits folder (24 px, 3 min) plan
    exactly as before the budget chose the tokens: the fewer-token grid, the same model and epochs."""
    side = 24 if n == 1437 else 28
    by_tokens = make_plan(fp(n, side=side), CPU2, budget_s=budget, elapsed_s=3.0, speed_fn=speeds_by_tokens)
    assert (by_tokens.overrides["data.init_args.img_size"], by_tokens.overrides["model.arch.patch_size"]) == (
        side,
        side // 4,
    )
    assert any(row[0] == "img_size, patch" and "16 tokens: 64 tokens would give" in row[2] for row in by_tokens.rows)


def test_without_a_budget_the_token_grid_is_the_fixed_rule():
    assert plan(fp(8000, side=64), speed=speeds_by_tokens)["model.arch.patch_size"] == 8  # 64 px, 8x8 grid
    assert plan(fp(8000, side=64), speed=speeds_by_tokens)["data.init_args.img_size"] == 64


def test_a_large_folder_in_a_short_budget_gets_epochs_before_width_and_light_augmentation():
    """30k-200k images: the largest model that still gets 40 epochs (at 15 minutes on 2 cores: the smallest), crops
    from 80% and no Random Erasing (docs/recipes.md, "At 60,000 images")."""
    p = plan(fp(50_000, n_val=10_000, side=28, symmetry=0.77), budget=900)
    assert (p["model.arch.embed_dim"], p["model.arch.depth"]) == MODELS[0][:2]
    assert p["trainer.max_epochs"] >= 40 and p["data.init_args.hflip"] is True
    assert p["data.init_args.crop_scale"] == [0.8, 1.0] and p["data.init_args.random_erasing"] == 0
    longer = plan(fp(50_000, n_val=10_000, side=28, symmetry=0.77), budget=4 * 3600)
    assert longer["model.arch.embed_dim"] > p["model.arch.embed_dim"]  # a longer budget buys width


def test_when_epochs_slow_down_mid_run_the_rest_of_the_schedule_is_compressed_into_the_time_left():
    """Timed: two 5-s epochs; then the machine slows to 7 s an epoch. The run is shortened so that it ends by the
    deadline, and the learning rate is continuous where it was shortened and ends at its last value."""
    now = [0.0]
    module = SimpleNamespace(recipe=TrainingRecipe(warmup_epochs=2, min_lr_ratio=0.01))
    trainer = FakeTrainer(40, module)
    saved = []
    cb = FitBudget(deadline=200.0, cap=100, on_change=saved.append, clock=lambda: now[0], teardown_s=0.0)
    epoch = 0
    while epoch < trainer.max_epochs:
        trainer.current_epoch = epoch
        cb.on_train_epoch_start(trainer, module)
        if epoch == 2:
            sized = trainer.max_epochs  # sized for 5-s epochs
            lam = trainer.lr_scheduler_configs[0].scheduler.lr_lambdas[0]
        now[0] += 5.0 if epoch < 2 else 7.0
        epoch += 1
    assert trainer.max_epochs < sized and saved[-1] == trainer.max_epochs  # shortened, plan.yaml told
    assert now[0] <= 200.0, now[0]  # ended in time
    new = trainer.lr_scheduler_configs[0].scheduler.lr_lambdas[0]
    assert new(10 * trainer.max_epochs) == pytest.approx(lam(10 * sized))  # the schedule's last value, at the end
    assert new(25) == pytest.approx(lam(25))  # unchanged before the slowdown (epoch 2) was seen


def test_compressed_schedule_is_the_original_played_faster():
    from vit.run.fit_budget import compressed

    f = lambda s: float(s)  # noqa: E731
    g = compressed(f, done=10, total=100, new_total=55)
    assert [g(s) for s in (0, 9, 10)] == [0.0, 9.0, 10.0] and g(55) == 100.0 and g(32.5) == pytest.approx(55.0)


def test_a_long_value_runs_into_its_reason_without_pushing_the_other_rows_off_a_terminal():
    from vit.planning.plan import TABLE_VALUE_WIDTH, Plan

    rows = [("data", "1181 train", "class balance 0.46"), ("measured", "8" * 200, "docs/recipes.md")]
    short, long = Plan({}, rows).table().splitlines()
    assert short.index("class balance") < 2 + len("measured") + 2 + TABLE_VALUE_WIDTH + 2
    assert long.endswith("8  docs/recipes.md")


def test_without_a_budget_the_plan_says_its_expected_time_and_what_its_tier_reached():
    result = make_plan(fp(50_000, n_val=10_000), CPU2, elapsed_s=3.0, speed_fn=speeds_like_2_cores)
    rows = {what: (value, why) for what, value, why in result.rows}
    minutes = result.estimate_s / 60
    assert f"(~{minutes:.0f} min on this machine)" in rows["estimate"][0]
    assert "15 min" in rows["measured"][0] and "%" in rows["measured"][0] and "{" not in rows["measured"][0]


def test_when_epochs_speed_up_mid_run_the_schedule_is_stretched_over_the_time_left():
    """Timed: two 8-s epochs (a busy moment); then 4 s an epoch. The run grows to use the budget, the learning rate
    stays continuous and still ends at its last value, and the run ends in time."""
    now = [0.0]
    module = SimpleNamespace(recipe=TrainingRecipe(warmup_epochs=2, min_lr_ratio=0.01))
    trainer = FakeTrainer(30, module)
    cb = FitBudget(deadline=200.0, cap=100, clock=lambda: now[0], teardown_s=0.0)
    epoch = 0
    while epoch < trainer.max_epochs:
        trainer.current_epoch = epoch
        cb.on_train_epoch_start(trainer, module)
        if epoch == 2:
            sized = trainer.max_epochs
            lam = trainer.lr_scheduler_configs[0].scheduler.lr_lambdas[0]
        now[0] += 8.0 if epoch < 2 else 4.0
        epoch += 1
    assert trainer.max_epochs > sized and 0.85 * 200 <= now[0] <= 200.0, (sized, trainer.max_epochs, now[0])
    new = trainer.lr_scheduler_configs[0].scheduler.lr_lambdas[0]
    assert new(10 * trainer.max_epochs) == pytest.approx(lam(10 * sized)) and new(25) == pytest.approx(lam(25))


def test_a_long_tailed_folder_gets_balanced_checkpoints_and_post_hoc_adjustment_a_balanced_one_does_not():
    from dataclasses import replace

    balanced = fp(15_000)
    counts = [round(4500 * 100 ** (-i / 9)) for i in range(10)]  # CIFAR-10-LT's profile at imbalance 100
    tailed = replace(balanced, class_counts=counts, n_train=sum(counts))
    p = plan(tailed, budget=300)
    assert p["model.posthoc_logit_adjust"] is True and p["checkpoint.monitor"] == "val/acc_balanced"
    rows = {name: why for name, _, why in make_plan(tailed, CPU2, 300, 3.0, speeds_like_2_cores).rows}
    assert rows["long tail"].startswith("class balance 0.01 < 0.5")
    same = plan(balanced, budget=300)
    assert "model.posthoc_logit_adjust" not in same and "checkpoint.monitor" not in same  # today's plan, unchanged
    assert {k: v for k, v in p.items() if k not in ("model.posthoc_logit_adjust", "checkpoint.monitor")}.keys() == (
        same.keys()
    )
    nearly = replace(balanced, class_counts=[1500] * 9 + [900])  # balance 0.6: not a long tail
    assert "model.posthoc_logit_adjust" not in plan(nearly, budget=300)


def test_photos_get_a_conv_stem_and_a_grid_that_a_busy_machine_cannot_flip():
    """300-px cells planned on a quiet machine got 128 px / patch 16, with one other process running 32 px / patch 8
    (a ~50% slower calibration): for photos the side and grid are a rule of the fingerprint, not of the timing."""
    from vit.planning.rules import PHOTO_GRID

    cells = fp(1181, n_val=295, classes=2, side=300, symmetry=0.98, gray=1.0)
    busy = lambda archs, batch, precision="32-true": [s / 2 for s in speeds_like_2_cores(archs, batch, precision)]  # noqa
    for budget in (300, 900):
        quiet, loaded = plan(cells, budget=budget), plan(cells, budget=budget, speed=busy)
        for p in (quiet, loaded):
            assert (p["data.init_args.img_size"], p["model.arch.patch_size"]) == PHOTO_GRID
            assert p["model.arch.stem"] == "conv"
    assert plan(fp(8000, side=28, symmetry=0.49), budget=300)["model.arch.stem"] == "patch"  # digits: as measured
    assert plan(fp(20000, side=64, symmetry=0.49), budget=300)["model.arch.stem"] == "patch"


@pytest.mark.parametrize(
    "name, f",
    [
        ("digits folder", fp(1437, n_val=360, side=24, symmetry=0.32)),
        ("MNIST 8k", fp(8000, n_val=2000, side=28, symmetry=0.49)),
        ("Fashion-MNIST 50k", fp(50000, n_val=10000, side=28, symmetry=0.76)),
    ],
)
def test_the_sets_the_old_rules_were_measured_on_keep_their_recipe(name, f):
    """The photo rules (turns, conv stem, lr, epoch cap) must leave the measured small-image plans as they were: their
    turn symmetry (digits 0.06, MNIST 0.21, Fashion-MNIST -0.04) is far below TURN_SYMMETRY and their side below
    PHOTO_SIDE."""
    from vit.planning.rules import LR, PHOTO_SIDE, TURN_SYMMETRY

    f.turn_symmetry = 0.21
    assert f.turn_symmetry < TURN_SYMMETRY and f.median_side < PHOTO_SIDE
    for budget in (None, 300, 900):
        p = make_plan(f, CPU2, budget_s=budget, elapsed_s=3.0, speed_fn=speeds_like_2_cores)
        o = p.overrides
        assert o["data.init_args.rot90"] is False and o["model.arch.stem"] == "patch" and o["model.lr"] == LR, name
        assert p.cap == 2 * (60 if f.n_train <= 3000 else 40 if f.n_train <= 30000 else 50)


def test_a_photo_plan_shows_what_photos_reached_not_the_digits_of_its_tier():
    from vit.planning.rules import MEASURED_PHOTOS

    cells = fp(1181, n_val=295, classes=2, side=300, symmetry=0.98)
    rows = {r[0]: r[1:] for r in make_plan(cells, CPU2, 900, 3.0, speeds_like_2_cores).rows}
    assert MEASURED_PHOTOS in rows["measured"][0] and "digits" not in rows["measured"][0]


def test_the_plan_table_says_how_a_teachers_time_is_taken(digits_folder, in_tmp, caplog):
    import logging

    flags = ["--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false", "--model.teacher", "test_resnet",
             *TINY_FLAGS]  # fmt: skip
    with caplog.at_level(logging.INFO):
        cli = train.main(["fit", "--config", "configs/folder.yaml", "--data.root", str(digits_folder), *flags])
    row = next(line for line in caplog.text.splitlines() if line.strip().startswith("teacher "))
    assert "test_resnet, trained first, for 30% of max_epochs" in row and "its score alone follows" in row
    assert cli.model.teacher_record["epochs"] == 1


def test_the_user_says_what_a_planned_run_optimises_and_the_plan_row_says_which_and_why():
    """--objective: accuracy or balanced accuracy whatever the class balance; auto follows the long-tail rule."""
    from dataclasses import replace

    from vit.planning.objective import with_objective

    balanced = fp(15_000)
    counts = [round(4500 * 100 ** (-i / 9)) for i in range(10)]
    tailed = replace(balanced, class_counts=counts, n_train=sum(counts))
    for data, objective, want in [
        (tailed, "auto", True),
        (tailed, "accuracy", False),
        (balanced, "auto", False),
        (balanced, "balanced", True),
    ]:
        p = with_objective(make_plan(data, CPU2, 300, 3.0, speeds_like_2_cores), data, objective)
        o, rows = p.overrides, {name: (value, why) for name, value, why in p.rows}
        assert (o.get("checkpoint.monitor") == "val/acc_balanced") == want == bool(o.get("model.posthoc_logit_adjust"))
        value, why = rows["objective"]
        assert value.startswith("balanced accuracy" if want else "accuracy") and "long tail" not in rows
        assert (f"--objective {objective}" in why) == (objective != "auto") and "class balance" in why
    with pytest.raises(ValueError, match="objective='recall' must be one of auto, accuracy, balanced"):
        with_objective(make_plan(tailed, CPU2, 300, 3.0, speeds_like_2_cores), tailed, "recall")
