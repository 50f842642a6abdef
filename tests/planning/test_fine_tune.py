"""`vit-train fit --model.init_from WEIGHTS` on a folder: the architecture, resolution and normalisation come from the
weights (vit/run/weights.py), and a field you set that they contradict is one line."""

import json
import shutil
from pathlib import Path

import pytest
import timm
import torch
from digits_folder import write_digits_folder
from safetensors.torch import save_file

import train
from vit.commands.eval import main as eval_main
from vit.commands.export import main as export_main
from vit.commands.predict import main as predict_main
from vit.commands.serve import build_parser as serve_parser
from vit.commands.serve import build_server
from vit.model.checkpoint import load_checkpoint


@pytest.fixture(scope="module")
def digits_folder(tmp_path_factory):
    return write_digits_folder(tmp_path_factory.mktemp("digits"), limit=200, val_size=40)


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """A timm ViT (2 heads of 48, class token) in timm's Hugging Face layout: model.safetensors and config.json."""
    folder = tmp_path_factory.mktemp("weights")
    src = timm.models.VisionTransformer(img_size=32, patch_size=8, embed_dim=96, depth=2, num_heads=2)
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, folder / "model.safetensors")
    cfg = {"mean": [0.4, 0.45, 0.5], "std": [0.2, 0.25, 0.3]}
    (folder / "config.json").write_text(json.dumps({"architecture": "vit_mine", "model_args": {"num_heads": 2},
                                                    "pretrained_cfg": cfg}))  # fmt: skip
    return folder / "model.safetensors", src


FLAGS = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "2"]
FLAGS += ["--trainer.enable_progress_bar", "false", "--attention_maps.num_images", "2"]


def test_a_folder_fine_tunes_the_weights_model_without_spelling_it(digits_folder, weights, in_tmp):
    path = in_tmp / "w" / "model.safetensors"  # a copy that this test deletes
    path.parent.mkdir()
    for f in ("model.safetensors", "config.json"):
        shutil.copy(weights[0].parent / f, path.parent / f)
    cli = train.main(["fit", "--data.root", str(digits_folder), "--model.init_from", str(path), *FLAGS])
    arch = cli.model.hparams.arch
    assert (arch["embed_dim"], arch["depth"], arch["num_heads"], arch["patch_size"]) == (96, 2, 2, 8)
    assert arch["global_pool"] == "token" and arch["qk_norm"] is False and arch["stem"] == "patch"
    assert arch["img_size"] == 32 and cli.datamodule.img_size == 32  # the weights' own resolution
    # a grey folder: one channel, the RGB weights' first layer summed and their mean averaged
    assert arch["in_chans"] == 1 and cli.datamodule.mean == pytest.approx((0.45,))
    assert cli.model.hparams.mean == pytest.approx([0.45])
    assert cli.model.model.head.out_features == 10
    last = next(in_tmp.glob("checkpoints/*/version_0/last.ckpt"))
    assert load_checkpoint(last)["hyper_parameters"]["init_from"] is None  # the checkpoint stands alone
    shutil.rmtree(path.parent)  # without the weights file: predict, eval, export, serve, and a resume from plan.yaml
    image = next((digits_folder / "val").rglob("*.png"))
    assert predict_main(["--ckpt", str(last), str(image), "--format", "json", "--out", str(in_tmp / "p.json")]) == 0
    assert json.loads((in_tmp / "p.json").read_text())[0]["predictions"][0]["label"] in cli.datamodule.class_names
    assert eval_main(["--ckpt", str(last), str(digits_folder / "val"), "--out", str(in_tmp / "eval")]) == 0
    assert export_main(["--ckpt", str(last), "--format", "timm", "--out", str(in_tmp / "timm")]) == 0
    server = build_server(serve_parser().parse_args(["--ckpt", str(last), "--device", "cpu"]))
    api = server.litapi_connector.lit_apis[0]
    api.setup("cpu")  # what a worker process does: the fine-tuned model, without the weights file it started from
    assert api.names == list(cli.datamodule.class_names) and api.shape == (1, 32, 32)
    plan = next(in_tmp.glob("logs/*/version_0/plan.yaml"))
    assert str(path) in plan.read_text()
    flags = [*FLAGS[2:], "--trainer.max_epochs", "2", "--ckpt_path", "last"]  # the newest last.ckpt of the run
    resumed = train.main(["fit", "--config", str(plan), *flags])
    assert resumed.trainer.current_epoch == 2 and resumed.model.hparams.arch["num_heads"] == 2
    assert Path(resumed.trainer.ckpt_path).resolve() == last.resolve()  # resumed from it, not trained afresh


def test_deits_distilled_weights_fine_tune_without_a_teacher(digits_folder, in_tmp):
    """DeiT's distilled weights (two prefix tokens with positions, two heads): the run keeps the class token (its
    position folded in) and the blocks, and leaves the distillation token out, since it would need a teacher."""
    from timm.models.deit import VisionTransformerDistilled

    src = VisionTransformerDistilled(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2)
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, in_tmp / "model.safetensors")
    (in_tmp / "config.json").write_text(json.dumps({"architecture": "deit_mine", "model_args": {"num_heads": 2}}))
    flags = [*FLAGS, "--trainer.limit_train_batches", "0", "--trainer.num_sanity_val_steps", "0"]  # no step: as loaded
    cli = train.main(["fit", "--data.root", str(digits_folder), "--model.init_from", str(in_tmp), *flags])
    model = cli.model.model
    assert cli.model.hparams.arch["dist_token"] is False and model.dist_token is None and model.num_prefix_tokens == 1
    assert torch.allclose(model.cls_token, src.cls_token + src.pos_embed[:, :1])
    assert torch.equal(model.blocks[1].mlp.fc2.weight, src.blocks[1].mlp.fc2.weight)


def test_a_field_that_contradicts_the_weights_is_one_line(digits_folder, weights, in_tmp):
    path, _ = weights
    args = ["fit", "--data.root", str(digits_folder), "--model.init_from", str(path), *FLAGS]
    with pytest.raises(SystemExit, match=r"^error: --model.arch.embed_dim 64 contradicts the weights' 96 \(init"):
        train.main([*args, "--model.arch.embed_dim", "64"])
    with pytest.raises(SystemExit, match=r"^error: init_from=.*: the weights have 2 attention heads, the config"):
        train.main([*args, "--model.arch.num_heads", "4"])
    with pytest.raises(SystemExit, match=r"^error: init_from=nowhere.safetensors: no such weights file"):
        train.main(["fit", "--data.root", str(digits_folder), "--model.init_from", "nowhere.safetensors", *FLAGS])
