"""A planned fine-tune (vit/planning/fine_tune_plan.py): the weights' model is kept, the resolution is the weights'
own unless the budget cannot give it FT_MIN_EPOCHS, the learning rate follows the batch, layer decay is on, and the
plan's table says so; end to end, `--model.init_from FILE --budget` on a folder."""

import json

import pytest
import timm
from digits_folder import write_digits_folder
from fake_speeds import CPU2
from safetensors.torch import save_file

import train
from vit.model.config import ViTConfig
from vit.planning.fine_tune_plan import FT_LAYER_DECAY, FT_LR_PER_256, FT_MIN_EPOCHS, make_fine_tune_plan
from vit.planning.fingerprint import Fingerprint
from vit.planning.rules import LR, PHOTO_LR

# A ViT-S/16 at 224 px, as the weights would say it (the config after vit/run/weights.py).
VIT_S = ViTConfig(img_size=224, patch_size=16, embed_dim=384, depth=12, num_heads=6, global_pool="token").to_dict()


def fp(n_train=2000, side=300):
    counts = [n_train // 2] * 2
    return Fingerprint("cells", n_train, n_train // 4, counts, side, side, side, 1.0, 0.9, 5.0, turn_symmetry=0.9)


def slow_by_tokens(archs, batch, precision="32-true"):
    """A ViT-S-like speed on 2 cores: 20 img/s at 196 tokens, faster with fewer; bf16 slower (no AMX)."""
    return [20.0 * 196 / (a.img_size // a.patch_size) ** 2 * (0.7 if precision != "32-true" else 1.0) for a in archs]


def plan(budget, speed=slow_by_tokens, arch=VIT_S):
    return make_fine_tune_plan(fp(), CPU2, budget, 3.0, speed, arch=arch, source="vit_small_patch16_224.augreg")


def test_a_fine_tune_keeps_the_weights_model_and_plans_its_lr_and_layer_decay():
    p = plan(budget=None)
    o = p.overrides
    assert not any(k in o for k in ("model.arch.embed_dim", "model.arch.depth", "model.arch.stem"))
    assert o["data.init_args.img_size"] == 224  # the weights' own resolution without a budget
    assert o["model.lr"] == pytest.approx(FT_LR_PER_256 * o["data.init_args.batch_size"] / 256)
    assert o["model.layer_decay"] == FT_LAYER_DECAY and o["model.optimizer"] == "adamw"
    rows = {name: (value, why) for name, value, why in p.rows}
    assert rows["model"][0] == "384 wide, 12 blocks, 6 heads" and "init_from=vit_small_patch16_224" in rows["model"][1]
    assert "layer decay 0.75" in rows["fine-tune"][0]
    assert "turns on" in rows["augmentation"][0]  # the data's rules stay the from-scratch plan's


def test_weights_narrower_than_vit_s_fine_tune_at_the_plans_lr_without_layer_decay():
    small = ViTConfig(img_size=28, patch_size=7, embed_dim=64, depth=3, num_heads=2).to_dict()
    p = make_fine_tune_plan(fp(side=28), CPU2, None, 3.0, slow_by_tokens, arch=small, source="mine.ckpt")
    assert p.overrides["model.lr"] == LR and p.overrides["model.layer_decay"] is None
    assert "measured here" in dict((name, why) for name, _, why in p.rows)["fine-tune"]
    photos = make_fine_tune_plan(fp(side=300), CPU2, None, 3.0, slow_by_tokens, arch=small, source="mine.ckpt")
    assert photos.overrides["model.lr"] == PHOTO_LR  # the photo plan's own


def test_the_budget_keeps_the_weights_resolution_only_where_it_buys_enough_epochs():
    roomy = plan(budget=3 * 3600)
    assert roomy.overrides["data.init_args.img_size"] == 224
    tight = plan(budget=15 * 60)  # at 224 px an epoch of 2,000 images takes ~2 min: fewer than FT_MIN_EPOCHS fit
    side = tight.overrides["data.init_args.img_size"]
    assert side < 224 and side % 16 == 0
    assert tight.overrides["trainer.max_epochs"] >= FT_MIN_EPOCHS
    assert tight.estimate_s <= 15 * 60
    why = dict((name, why) for name, _, why in tight.rows)["img_size, patch"]
    assert f"fewer than {FT_MIN_EPOCHS} epochs" in why


@pytest.fixture(scope="module")
def digits_folder(tmp_path_factory):
    return write_digits_folder(tmp_path_factory.mktemp("digits"), limit=200, val_size=40)


def test_a_budgeted_fine_tune_of_a_timm_file_is_planned_and_saved(digits_folder, in_tmp, capsys):
    src = timm.models.VisionTransformer(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=2)
    folder = in_tmp / "w"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"model_args": {"num_heads": 2}}))
    # the budget counts from the process's start (pytest's, minutes ago): an hour leaves room; the epochs are fixed
    flags = ["--budget", "1h", "--trainer.max_epochs", "2", "--trainer.limit_train_batches", "2"]
    flags += ["--trainer.enable_progress_bar", "false", "--attention_maps.every_n_epochs", "0"]
    cli = train.main(["fit", "--data.root", str(digits_folder), "--model.init_from", str(folder), *flags])
    hp = cli.model.hparams
    assert (hp.arch["embed_dim"], hp.arch["depth"], hp.arch["num_heads"]) == (48, 2, 2)  # not a planned candidate
    assert hp.layer_decay is None and hp.lr == LR  # 48 wide: the from-scratch plan's lr, measured here
    assert cli.datamodule.img_size == 32
    saved = next(in_tmp.glob("logs/*/version_0/plan.yaml")).read_text()
    assert "fine-tune" in saved and "(the from-scratch plan's), no layer decay" in saved


def test_a_large_model_is_timed_on_a_small_batch_and_a_small_one_on_the_plans():
    batches = []

    def recording(archs, batch, precision="32-true"):
        batches.append(batch)
        return slow_by_tokens(archs, batch, precision)

    plan(budget=3 * 3600, speed=recording)
    assert set(batches) == {16}  # ViT-S: 21M block parameters
    batches.clear()
    small = ViTConfig(img_size=64, patch_size=16, embed_dim=96, depth=4, num_heads=3, stem="conv").to_dict()
    p = plan(budget=3 * 3600, speed=recording, arch=small)
    assert set(batches) == {p.overrides["data.init_args.batch_size"]} == {64}
