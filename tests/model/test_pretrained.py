"""Weights to start from (vit/model/pretrained.py): named through a Hugging Face cache the test writes, read with
timm's config.json, the head count never guessed, grey images from RGB weights. No network."""

import json

import pytest
import timm
import torch
from safetensors.torch import save_file

from vit.model.interop import InteropError, from_timm
from vit.model.pretrained import find_pretrained, load_pretrained
from vit.model.vision_transformer import VisionTransformer


def _save(model, folder, config: dict | None = None):
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    return folder / "model.safetensors"


def test_heads_that_are_not_64_wide_come_from_config_json_or_stop(tmp_path):
    # 2 heads of 96: a guess of embed_dim / 64 = 3 heads matches every shape and gives other logits
    src = timm.models.VisionTransformer(img_size=32, patch_size=8, embed_dim=192, depth=2, num_heads=2).eval()
    bare = _save(src, tmp_path / "bare")
    with pytest.raises(InteropError, match="do not say how many attention heads.*--model.arch.num_heads"):
        find_pretrained(bare)
    with pytest.raises(InteropError, match="do not say how many attention heads"):
        from_timm(bare)
    told = _save(src, tmp_path / "told", {"architecture": "custom_vit", "model_args": {"num_heads": 2}})
    with pytest.raises(InteropError, match="2 attention heads, the config num_heads=3"):
        find_pretrained(told, num_heads=3)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(from_timm(told).eval()(x), src(x), atol=1e-5, rtol=0)


def test_a_timm_architecture_name_gives_the_heads_and_the_normalisation(tmp_path):
    args = {"depth": 2, "img_size": 28}  # ViT-H/14's shape at depth 2: 16 heads of 80, not 20 of 64
    src = timm.create_model("vit_huge_patch14_224", **args).eval()
    path = _save(src, tmp_path / "h14", {"architecture": "vit_huge_patch14_224", "model_args": args})
    weights = find_pretrained(path)
    assert weights.arch["num_heads"] == 16 and weights.arch["embed_dim"] == 1280
    assert weights.mean == (0.5, 0.5, 0.5) and weights.std == (0.5, 0.5, 0.5)  # timm's pretrained_cfg
    x = torch.randn(1, 3, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(from_timm(path).eval()(x), src(x), atol=1e-4, rtol=0)


def test_a_timm_name_is_found_in_the_hugging_face_cache_and_offline_says_where_to_put_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    name = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
    folder = tmp_path / "hub" / f"models--timm--{name}"
    with pytest.raises(InteropError) as e:
        find_pretrained(name)
    message = str(e.value)
    assert "\n" not in message and str(folder) in message and "huggingface.co/timm/" + name in message
    assert "HF_HUB_OFFLINE" in message
    src = timm.create_model("vit_tiny_patch16_224", depth=1, img_size=32).eval()
    _save(src, folder / "snapshots" / "0123abc", {"architecture": "vit_tiny_patch16_224"})  # no model_args: shapes
    for spelled in (name, f"hf-hub:timm/{name}", f"timm/{name}"):
        weights = find_pretrained(spelled)
        assert weights.path == folder / "snapshots" / "0123abc" / "model.safetensors"
        assert weights.arch["num_heads"] == 3 and weights.arch["depth"] == 1 and weights.mean == (0.5, 0.5, 0.5)
    with pytest.raises(InteropError, match="no such weights file, and not a timm model name"):
        find_pretrained("not_a_model_at_all")
    with pytest.raises(InteropError, match="no such weights file"):
        find_pretrained(tmp_path / "missing.safetensors")


def test_grey_images_from_rgb_weights_and_a_new_size(tmp_path):
    src = timm.models.VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=2, qk_norm=True)
    weights = find_pretrained(_save(src, tmp_path / "rgb"))  # qk_norm's size is the head size: 2 heads of 32
    arch = {k: v for k, v in weights.arch.items() if k not in ("in_chans", "img_size", "num_classes")}
    model = VisionTransformer(**arch, in_chans=1, img_size=48, num_classes=4)
    load_pretrained(model, weights)
    kernel = src.patch_embed.proj.weight.detach()  # (64, 3, 8, 8): timm's adapt_input_conv sums the channels
    torch.testing.assert_close(model.patch_embed.proj.weight.detach(), kernel.sum(1, keepdim=True))
    assert model.pos_embed.shape == (1, 36, 64) and model.head.out_features == 4  # 6x6 grid, a new head
    torch.testing.assert_close(model.blocks[0].attn.qkv.weight, src.blocks[0].attn.qkv.weight)
    conv = VisionTransformer(**{**arch, "stem": "conv"})
    with pytest.raises(InteropError, match="stem='conv'"):
        load_pretrained(conv, weights)
    wide = VisionTransformer(**{**arch, "embed_dim": 128, "num_heads": 2})
    with pytest.raises(InteropError, match="embed_dim 64 in the weights, 128 in the config"):
        load_pretrained(wide, weights)


@pytest.mark.parametrize(
    "name, args",
    [
        ("vit_tiny_patch16_224", {}),
        ("vit_small_patch16_224", {"class_token": False, "global_pool": "avg"}),
        ("vit_base_patch16_224", {"qk_norm": True}),
        ("vit_large_patch16_224", {"init_values": 1e-5}),
        ("vit_huge_patch14_224", {}),
    ],
    ids=["Ti", "S-avg", "B-qknorm", "L-layerscale", "H-heads-of-80"],
)
def test_the_common_timm_vits_by_name_give_timms_logits(name, args, tmp_path):
    """Ti/S/B/L/H shapes (one block each: the width and heads are what differ), read from timm's layout by their
    registry name alone: the head count and the rest come from timm, the logits are timm's."""
    args = {"depth": 1, "img_size": 28 if "14" in name else 32, **args}
    src = timm.create_model(name, **args).eval()
    path = _save(src, tmp_path / name, {"architecture": name, "model_args": {k: v for k, v in args.items()}})
    model = from_timm(path).eval()
    assert model.blocks[0].attn.num_heads == src.blocks[0].attn.num_heads
    x = torch.randn(2, 3, args["img_size"], args["img_size"])
    with torch.no_grad():
        torch.testing.assert_close(model(x), src(x), atol=1e-4, rtol=1e-4)


def test_weights_are_read_once_per_run_and_let_go_once_loaded(tmp_path, monkeypatch):
    import vit.model.pretrained as pretrained

    reads = []
    real = pretrained.load_state_dict
    monkeypatch.setattr(pretrained, "load_state_dict", lambda p: reads.append(p) or real(p))
    src = timm.models.VisionTransformer(img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2)
    path = _save(src, tmp_path / "w", {"model_args": {"num_heads": 2}})
    first = find_pretrained(path)  # the command, for the architecture
    again = find_pretrained(path, num_heads=2)  # the module, for the weights
    assert len(reads) == 1 and again.state_dict is first.state_dict
    model = VisionTransformer(**{k: v for k, v in first.arch.items()})
    load_pretrained(model, again)
    assert pretrained._last_read is None  # not kept beside the model's copy
    _save(timm.models.VisionTransformer(img_size=16, patch_size=8, embed_dim=32, depth=2, num_heads=2), path.parent)
    assert find_pretrained(path).arch["depth"] == 2 and len(reads) == 2  # a new file is read again


def test_the_head_is_kept_only_for_the_same_classes(tmp_path):
    src = VisionTransformer(img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=2)
    hp = {"arch": src.cfg.to_dict(), "class_names": ["cat", "dog"], "mean": [0.5] * 3, "std": [0.5] * 3}
    sd = {f"model.{k}": v for k, v in src.state_dict().items()}
    torch.save({"state_dict": sd, "hyper_parameters": hp}, tmp_path / "m.ckpt")
    weights = find_pretrained(tmp_path / "m.ckpt")
    assert weights.class_names == ["cat", "dog"]
    for names, kept in ((["cat", "dog"], True), (["bolt", "nut"], False), (None, True)):
        model = VisionTransformer(**src.cfg.to_dict())
        load_pretrained(model, find_pretrained(tmp_path / "m.ckpt"), names)
        assert torch.equal(model.head.weight, src.head.weight) == kept, names
        assert torch.equal(model.blocks[0].attn.qkv.weight, src.blocks[0].attn.qkv.weight)


def test_a_distillation_token_is_left_out_or_added_when_fine_tuning(tmp_path):
    """A distilled checkpoint into a model without the token: the blocks and the class head go on, the token and its
    head are left out; a plain checkpoint into a model with one: the token and its head are new."""
    arch = dict(img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=2)
    for src_dist, dist in ((True, False), (False, True)):
        src = VisionTransformer(**arch, dist_token=src_dist)
        hp = {"arch": src.cfg.to_dict(), "mean": [0.5] * 3, "std": [0.5] * 3}
        torch.save({"state_dict": {f"model.{k}": v for k, v in src.state_dict().items()}, "hyper_parameters": hp},
                   tmp_path / "m.ckpt")  # fmt: skip
        model = VisionTransformer(**arch, dist_token=dist)
        fresh = model.head_dist.weight.clone() if dist else None
        load_pretrained(model, find_pretrained(tmp_path / "m.ckpt"))
        assert torch.equal(model.head.weight, src.head.weight)
        assert torch.equal(model.blocks[0].attn.qkv.weight, src.blocks[0].attn.qkv.weight)
        assert (model.dist_token is not None) == dist and (not dist or torch.equal(model.head_dist.weight, fresh))
