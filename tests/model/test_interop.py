"""timm interop: exact logits for several timm ViT configurations with random weights (no network)."""

import pytest
import timm
import torch
from safetensors.torch import save_file

from vit.model.interop import InteropError, from_timm, load_state_dict, to_timm

# vit_tiny / vit_small-style shapes, scaled down where the shape does not matter, with and without class token,
# qk_norm, LayerScale, no_embed_class and fc_norm.
CASES = {
    "tiny_cls": dict(img_size=32, patch_size=8, embed_dim=192, depth=2, num_heads=3),
    "small_cls_qknorm": dict(img_size=32, patch_size=8, embed_dim=384, depth=2, num_heads=6, qk_norm=True),
    "tiny_avg_nocls": dict(
        img_size=32,
        patch_size=4,
        embed_dim=192,
        depth=2,
        num_heads=3,
        class_token=False,
        global_pool="avg",
        qk_norm=True,
    ),
    "tiny_layerscale_noembedcls": dict(
        img_size=32, patch_size=8, embed_dim=192, depth=2, num_heads=3, init_values=0.1, no_embed_class=True
    ),
    "tiny_avg_nofcnorm": dict(
        img_size=32,
        patch_size=8,
        embed_dim=192,
        depth=2,
        num_heads=3,
        class_token=False,
        global_pool="avg",
        fc_norm=False,
    ),
}


def _timm(cfg, seed=0):
    torch.manual_seed(seed)
    model = timm.models.VisionTransformer(num_classes=7, **cfg).eval()
    with torch.no_grad():  # random, non-trivial values everywhere (timm inits cls/pos/LayerScale to constants)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


@pytest.mark.parametrize("name", CASES)
def test_converted_model_gives_timms_logits(name):
    ref = _timm(CASES[name])
    ours = from_timm(ref).eval()
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", CASES)
def test_round_trip_back_to_timm_is_exact(name):
    ref = _timm(CASES[name])
    back = to_timm(from_timm(ref))
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(back(x), ref(x), atol=1e-5, rtol=0)
    if CASES[name].get("no_embed_class") or not CASES[name].get("class_token", True):
        # same layout: every tensor comes back bit for bit
        for k, v in ref.state_dict().items():
            assert torch.equal(back.state_dict()[k], v), k


@pytest.mark.parametrize("name", ["tiny_cls", "tiny_avg_nocls"])
def test_resampled_to_a_new_image_size_matches_timms_own_resampling(name):
    cfg = CASES[name]
    ref = _timm(cfg)
    timm_big = timm.models.VisionTransformer(num_classes=7, **{**cfg, "img_size": 48}).eval()
    timm_big.load_state_dict(timm.models.vision_transformer.checkpoint_filter_fn(ref.state_dict(), timm_big))
    ours = from_timm(ref, img_size=48).eval()
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), timm_big(x), atol=1e-5, rtol=0)


def test_patch_embedding_resampled_to_a_new_patch_size_keeps_the_function_roughly():
    ref = _timm(CASES["tiny_cls"])
    ours = from_timm(ref, patch_size=4, img_size=16)  # FlexiViT: 8x8 kernels on 32 px ~ 4x4 kernels on 16 px
    assert ours.patch_embed.proj.weight.shape[-1] == 4 and ours.grid_size == (4, 4)
    x = torch.randn(2, 3, 32, 32)
    small = torch.nn.functional.interpolate(x, size=16, mode="area")
    with torch.no_grad():
        a, b = ref(x), ours.eval()(small)
    assert torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0) > 0.5


def test_files_safetensors_and_pth_and_a_new_head(tmp_path):
    ref = _timm(CASES["small_cls_qknorm"])
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, tmp_path / "m.safetensors")
    torch.save({"state_dict": ref.state_dict()}, tmp_path / "m.pth")
    x = torch.randn(2, 3, 32, 32)
    for f in ("m.safetensors", "m.pth"):
        with torch.no_grad():
            torch.testing.assert_close(from_timm(tmp_path / f).eval()(x), ref(x), atol=1e-5, rtol=0)
    new = from_timm(tmp_path / "m.safetensors", num_classes=3)
    assert new.head.out_features == 3
    torch.testing.assert_close(new.blocks[1].mlp.fc2.weight, ref.blocks[1].mlp.fc2.weight)


def test_clear_errors(tmp_path):
    with pytest.raises(InteropError, match="no such weights file"):
        load_state_dict(tmp_path / "missing.pth")
    torch.save({"x": torch.zeros(1)}, tmp_path / "other.pth")
    with pytest.raises(InteropError, match="not a timm ViT"):
        load_state_dict(tmp_path / "other.pth")
    avg_cls = timm.models.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=1, global_pool="avg"
    )
    with pytest.raises(InteropError, match="class token with average pooling"):
        from_timm(avg_cls)


def test_fine_tune_from_a_timm_file_on_digits(tmp_path):
    """A randomly initialised timm ViT saved to a file, fine-tuned on digits through --model.init_from."""
    import lightning as L

    from vit.data.digits import DigitsDataModule
    from vit.training.module import ViTClassifier

    cfg = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2)
    src = timm.models.VisionTransformer(num_classes=1000, **cfg)
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, tmp_path / "vit.safetensors")
    L.seed_everything(0)
    module = ViTClassifier(
        arch=dict(**cfg, global_pool="token", qk_norm=False),
        lr=2e-3,
        warmup_epochs=0.2,
        layer_decay=0.75,
        init_from=str(tmp_path / "vit.safetensors"),
    )
    assert module.model.head.out_features == 10  # the data's classes, not timm's 1000
    torch.testing.assert_close(module.model.blocks[1].attn.qkv.weight, src.blocks[1].attn.qkv.weight)
    dm = DigitsDataModule(batch_size=64, crop_padding=0)
    val = torch.cat([x for x, _ in dm._device_batches("val")]), dm.memory["val"][1]

    def val_loss():
        with torch.no_grad():
            return torch.nn.functional.cross_entropy(module.model.eval()(val[0]), val[1]).item()

    before = val_loss()
    trainer = L.Trainer(
        max_epochs=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=dm)
    lrs = sorted({g["lr"] for g in trainer.optimizers[0].param_groups})
    assert len(lrs) > 2  # layer-wise decay: one learning rate per depth
    assert val_loss() < before - 0.3
    # the checkpoint holds the weights: it loads (and resumes) after the weights file is gone
    trainer.save_checkpoint(tmp_path / "tuned.ckpt")
    (tmp_path / "vit.safetensors").unlink()
    reloaded = ViTClassifier.load_from_checkpoint(tmp_path / "tuned.ckpt", weights_only=True)
    assert reloaded.hparams.init_from is None
    assert torch.load(tmp_path / "tuned.ckpt", weights_only=True)["init_from"].endswith("vit.safetensors")
    torch.testing.assert_close(reloaded.model.eval()(val[0][:4]), module.model.eval()(val[0][:4]))


def test_init_from_a_different_architecture_is_one_clear_error(tmp_path):
    from vit.training.module import ViTClassifier

    src = timm.models.VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2)
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, tmp_path / "vit.safetensors")
    with pytest.raises(InteropError, match="depth 2 in the weights, 3 in the config"):
        ViTClassifier(
            arch=dict(patch_size=8, embed_dim=64, depth=3, num_heads=2, global_pool="token", qk_norm=False),
            init_from=str(tmp_path / "vit.safetensors"),
        )


@pytest.mark.parametrize("distilled", [False, True])
def test_freeze_backbone_trains_only_the_head_first(distilled, tmp_path):
    import lightning as L

    from vit.data.digits import DigitsDataModule
    from vit.training.module import ViTClassifier

    L.seed_everything(0)
    arch = dict(patch_size=8, embed_dim=32, depth=1, num_heads=2, dist_token=distilled)
    teacher = {"teacher": "test_resnet", "teacher_share": 0.1} if distilled else {}
    module = ViTClassifier(arch=arch, freeze_backbone_epochs=1, **teacher)
    before = {k: v.clone() for k, v in module.model.state_dict().items()}
    trainer = L.Trainer(
        default_root_dir=tmp_path,  # where the teacher file goes when there is no checkpoint folder or logger
        max_epochs=1,
        limit_train_batches=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=DigitsDataModule(batch_size=32))
    after = module.model.state_dict()
    changed = {k for k in after if not torch.equal(after[k], before[k])}
    assert changed == {"head.weight", "head.bias"} | ({"head_dist.weight", "head_dist.bias"} if distilled else set())


def test_variants_without_a_timm_counterpart_are_refused():
    from vit.model.vision_transformer import VisionTransformer

    for cfg in (
        {"num_kv_heads": 1},
        {"pos_embed": "rope2d"},
        {"mlp_layer": "swiglu"},
        {"kv_latent_dim": 8},
        {"moe_experts": 2},
        {"stem": "conv"},
        {"stem": "spt"},
        {"lsa": True},
        {"dist_token": True},
    ):
        with pytest.raises(InteropError, match="only the plain model converts"):
            to_timm(VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, **cfg))


def test_deits_distilled_weights_give_timms_answer(tmp_path):
    """timm's VisionTransformerDistilled (DeiT: class and distillation tokens, both with positions, two heads) loads
    as dist_token: the same eval logits (the mean of both heads), from the model or from a weights file; a new class
    count replaces both heads."""
    from timm.models.deit import VisionTransformerDistilled

    torch.manual_seed(0)
    ref = VisionTransformerDistilled(img_size=32, patch_size=8, num_classes=7, embed_dim=64, depth=2, num_heads=2)
    ref.eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    ours = from_timm(ref).eval()
    assert ours.cfg.dist_token and ours.num_prefix_tokens == 2
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=0)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, tmp_path / "deit.safetensors")
    with torch.no_grad():
        torch.testing.assert_close(from_timm(tmp_path / "deit.safetensors", num_heads=2).eval()(x), ref(x),
                                   atol=1e-5, rtol=0)  # fmt: skip
    new = from_timm(ref, num_classes=3)
    assert new.head.out_features == new.head_dist.out_features == 3
    torch.testing.assert_close(new.dist_token, ref.dist_token + ref.pos_embed[:, 1:2])  # its position folded in
