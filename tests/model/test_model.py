import math

import pytest
import torch
import torch.nn.functional as F

from vit.model.layers import sincos_2d_pos_embed
from vit.model.vision_transformer import Attention, VisionTransformer

TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=7)
CONFIGS = [
    {},
    {"global_pool": "token"},
    {"pos_embed": "sincos2d"},
    {"norm_layer": "rmsnorm"},
    {"qk_norm": False, "qkv_bias": False},
    {"init_values": 1e-5, "fc_norm": True},
    {"patch_size": 4, "in_chans": 1},
    {"dist_token": True},
    {"dist_token": True, "global_pool": "token", "fc_norm": True},
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_shapes(cfg):
    model = VisionTransformer(**{**TINY, **cfg})
    x = torch.randn(3, cfg.get("in_chans", 3), 32, 32)
    assert model(x).shape == (3, 7)
    tokens = model.forward_features(x)
    n = (32 // model.patch_embed.patch_size) ** 2 + (cfg.get("global_pool") == "token") + cfg.get("dist_token", 0)
    assert tokens.shape == (3, n, 32)


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_every_parameter_gets_a_gradient(cfg):
    model = VisionTransformer(**{**TINY, **cfg})
    model(torch.randn(2, cfg.get("in_chans", 3), 32, 32)).square().sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing


def test_timm_submodule_names():
    names = set(dict(VisionTransformer(**TINY).named_parameters()))
    for n in (
        "patch_embed.proj.weight",
        "pos_embed",
        "blocks.0.norm1.weight",
        "blocks.0.attn.qkv.weight",
        "blocks.0.attn.q_norm.weight",
        "blocks.0.attn.k_norm.weight",
        "blocks.0.attn.proj.weight",
        "blocks.0.norm2.weight",
        "blocks.0.mlp.fc1.weight",
        "blocks.0.mlp.fc2.weight",
        "norm.weight",
        "head.weight",
    ):
        assert n in names


def test_init_is_trunc_normal_002():
    model = VisionTransformer(img_size=32, patch_size=4, embed_dim=192, depth=2, num_heads=3)
    w = model.blocks[0].mlp.fc1.weight
    # timm's trunc_normal_ cuts at +-2 absolute (not 2 std), so this is a plain normal(0, 0.02); torch's default
    # kaiming-uniform for 192 inputs would give std 0.042.
    assert abs(w.std().item() - 0.02) < 0.001 and abs(w.mean().item()) < 0.001
    assert model.blocks[0].attn.qkv.bias.abs().sum() == 0


@pytest.mark.parametrize("cfg", [{}, {"qk_norm": False}, {"global_pool": "token", "norm_layer": "rmsnorm"}], ids=str)
def test_fused_and_manual_attention_agree(cfg):
    model = VisionTransformer(**{**TINY, **cfg})
    x = torch.randn(4, 3, 32, 32)
    grads = []
    for fused in (True, False):
        model.set_fused_attn(fused)
        model.zero_grad()
        out = model(x)
        out.square().sum().backward()
        grads.append((out.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(grads[0][0], grads[1][0], atol=1e-5, rtol=0)
    for a, b in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_manual_attention_matches_reference():
    attn = Attention(16, num_heads=2, qk_norm=True).eval()
    attn.fused_attn = False
    x = torch.randn(2, 5, 16)
    q, k, v = attn.qkv(x).reshape(2, 5, 3, 2, 8).permute(2, 0, 3, 1, 4)
    q, k = F.layer_norm(q, (8,), eps=1e-5), F.layer_norm(k, (8,), eps=1e-5)  # fresh LayerNorm: weight 1, bias 0
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1)
    ref = attn.proj((w @ v).transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(attn(x), ref, atol=1e-5, rtol=0)


def test_sincos_matches_formula():
    pe = sincos_2d_pos_embed(3, 4, 8)[0]  # (12, 8)
    omega = 1.0 / 10000 ** (torch.arange(2) / 1.0)
    for idx in range(12):
        r, c = divmod(idx, 4)
        expect = torch.cat([torch.sin(c * omega), torch.cos(c * omega), torch.sin(r * omega), torch.cos(r * omega)])
        torch.testing.assert_close(pe[idx], expect)


def test_learned_pos_embed_is_resampled_bicubic_for_a_new_size():
    model = VisionTransformer(**TINY)  # trained grid 4x4
    new = model.pos_embed_for((6, 5))
    grid = model.pos_embed.reshape(1, 4, 4, 32).permute(0, 3, 1, 2)
    # timm's resample_abs_pos_embed: bicubic with antialias=True (torch's PIL-style cubic kernel, a=-0.5)
    ref = F.interpolate(grid, size=(6, 5), mode="bicubic", antialias=True).permute(0, 2, 3, 1).reshape(1, 30, 32)
    torch.testing.assert_close(new, ref, atol=1e-6, rtol=0)
    assert model.pos_embed_for((4, 4)) is model.pos_embed
    assert model(torch.randn(2, 3, 48, 40)).shape == (2, 7)


def test_sincos_pos_embed_is_recomputed_for_a_new_size():
    model = VisionTransformer(**{**TINY, "pos_embed": "sincos2d"})
    torch.testing.assert_close(model.pos_embed_for((6, 5)), sincos_2d_pos_embed(6, 5, 32))
    assert "pos_embed" not in model.state_dict()  # fixed, recomputed: not a weight


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"img_size": 30}, "img_size=30 is not divisible by patch_size=8"),
        ({"num_heads": 5}, "embed_dim=32 is not divisible by num_heads=5"),
        ({"embed_dim": 18, "num_heads": 3, "pos_embed": "sincos2d"}, "embed_dim=18 must be divisible by 4"),
        ({"global_pool": "max"}, "global_pool='max'"),
        ({"pos_embed": "rope"}, "pos_embed='rope'"),
        ({"norm_layer": "batchnorm"}, "norm_layer='batchnorm'"),
        ({"drop_path_rate": 1.5}, "drop_path_rate=1.5"),
        ({"depth": 0}, "depth=0"),
    ],
)
def test_invalid_config_names_field_and_value(bad, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        VisionTransformer(**{**TINY, **bad})


def test_input_not_divisible_by_patch_is_a_clear_error():
    with pytest.raises(ValueError, match="input size 30x32 is not divisible by patch_size=8"):
        VisionTransformer(**TINY)(torch.randn(1, 3, 30, 32))


def test_the_plain_attention_reads_short_and_masks_and_rope_tables_are_buffers_that_follow_to():
    """The attention's forward stays the paper's few lines (variants are functions and projections beside it); the
    trained grid's mask and RoPE tables are non-persistent buffers: .to() moves them, checkpoints do not hold them."""
    import inspect

    assert len(inspect.getsource(Attention.forward).splitlines()) <= 30
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, pos_embed="rope2d",
                              attn_pattern="local", attn_window=3, lsa=True)  # fmt: skip
    buffers = dict(model.named_buffers())
    assert {"attn_mask", "rope_cos", "rope_sin"} <= set(buffers) and not {"attn_mask", "rope_cos"} & set(
        model.state_dict()
    )
    assert buffers["attn_mask"].shape == (16, 16) and not buffers["attn_mask"].diagonal().any()  # LSA: no self
    x = torch.randn(2, 3, 32, 32)
    model.eval()
    want = model(x)
    half = model.to(torch.bfloat16)
    assert half.rope_cos.dtype == torch.bfloat16 and half.attn_mask.dtype == torch.bool
    # within a few hundredths of the logits' scale (bf16's 8-bit mantissa), not an absolute 0.1 of their own size
    assert (half(x.bfloat16()).float() - want).abs().max() <= 0.05 * want.abs().max() and want.abs().max() > 0
    assert model.to(torch.float32).rope_for((4, 4), x.device)[0] is model.rope_cos  # the trained grid: the buffer
    assert model.rope_for((2, 2), x.device)[0].shape[0] == 4  # another grid: computed for it
