"""Attention and block variants, each against a plain reference written here, through both attention paths, and
trained end to end from its config."""

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vit.evaluation.attention_maps import capture_attention
from vit.model.attention import Attention, LatentAttention
from vit.model.config import ViTConfig
from vit.model.layers import apply_rope, attention_pattern_mask, rope_2d
from vit.model.vision_transformer import Block, VisionTransformer, build_block, shifted_patches

ROOT = Path(__file__).parents[2]
VARIANTS = sorted((ROOT / "configs" / "variants").glob("*.yaml"))
SMALL = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=5)


@pytest.mark.parametrize("kv", [1, 2, 4])
def test_grouped_query_attention_matches_a_per_head_loop(kv):
    attn = Attention(32, num_heads=4, num_kv_heads=kv).eval()
    assert attn.qkv.out_features == (4 + 2 * kv) * 8  # kv heads are not stored per query head
    x = torch.randn(2, 6, 32)
    q, k, v = attn.qkv_heads(x)
    heads = []
    for h in range(4):  # query head h reads kv head h // (4 / kv)
        g = h // (4 // kv)
        w = torch.softmax(q[:, h] @ k[:, g].transpose(-2, -1) / math.sqrt(8), dim=-1)
        heads.append(w @ v[:, g])
    ref = attn.proj(torch.stack(heads, 1).transpose(1, 2).reshape(2, 6, 32))
    for fused in (True, False):
        attn.fused_attn = fused
        torch.testing.assert_close(attn(x), ref, atol=1e-5, rtol=0)


def _reference_allowed(grid, pattern, window, dilation, global_tokens, qr, qc, kr, kc):
    local = abs(qr - kr) <= window // 2 and abs(qc - kc) <= window // 2
    dilated = (qr - kr) % dilation == 0 and (qc - kc) % dilation == 0
    if pattern == "local":
        return local
    if pattern == "dilated":
        return dilated
    qi, ki = qr * grid[1] + qc, kr * grid[1] + kc
    return local or dilated or qi < global_tokens or ki < global_tokens


@pytest.mark.parametrize("pattern", ["local", "dilated", "sparse"])
@pytest.mark.parametrize("prefix", [0, 1])
def test_pattern_masks_match_a_loop_over_query_patches(pattern, prefix):
    grid, window, dilation, glob = (4, 5), 3, 2, 2
    mask = attention_pattern_mask(grid, pattern, window, dilation, glob, prefix)
    assert mask.shape == (prefix + 20, prefix + 20)
    assert mask[:prefix].all() and mask[:, :prefix].all()  # the class token is global
    for qi in range(20):
        for ki in range(20):
            expect = _reference_allowed(grid, pattern, window, dilation, glob, *divmod(qi, 5), *divmod(ki, 5))
            assert bool(mask[prefix + qi, prefix + ki]) == expect, (qi, ki)


VARIANT_MODELS = {
    "gqa": dict(num_kv_heads=2),
    "mqa": dict(num_kv_heads=1),
    "local": dict(attn_pattern="local", img_size=48),
    "dilated": dict(attn_pattern="dilated", global_pool="token"),
    "sparse": dict(attn_pattern="sparse", attn_global_tokens=2, num_kv_heads=2),
    "swiglu": dict(mlp_layer="swiglu"),
    "rmsnorm": dict(norm_layer="rmsnorm"),
    "postnorm": dict(norm_position="post"),
    "rope2d": dict(pos_embed="rope2d"),
    "mla": dict(kv_latent_dim=8),
    "mla_gqa": dict(kv_latent_dim=8, num_kv_heads=2),
    "moe": dict(moe_experts=3, moe_top_k=2, moe_capacity_factor=0),
    "rope_abs_token": dict(rope=True, global_pool="token"),
    "convstem": dict(stem="conv"),
    "resnetstem": dict(stem="resnet"),
    "efficientnet_stem": dict(stem="tf_efficientnet_lite0"),
    "spt_lsa": dict(stem="spt", lsa=True),
    "lsa_local_token": dict(lsa=True, attn_pattern="local", global_pool="token", img_size=48),
    "mimetic": dict(weight_init="mimetic"),
    "dist": dict(dist_token=True),
    "dist_token_sparse": dict(dist_token=True, global_pool="token", attn_pattern="sparse", attn_global_tokens=2),
}


@pytest.mark.parametrize("name", VARIANT_MODELS)
def test_fused_and_manual_paths_agree_and_maps_can_be_drawn(name):
    cfg = {**SMALL, **VARIANT_MODELS[name]}
    model = VisionTransformer(**cfg)
    x = torch.randn(3, 3, cfg["img_size"], cfg["img_size"])
    outs = []
    for fused in (True, False):
        model.set_fused_attn(fused)
        model.zero_grad()
        out = model(x)
        out.square().sum().backward()
        outs.append(
            (out.detach(), [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()])
        )
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=1e-5, rtol=0)
    for a, b in zip(outs[0][1], outs[1][1]):  # gradients of a sum of squares reach ~10: relative tolerance
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-3)
    attns, _ = capture_attention(model.eval(), x)  # what the attention-map callback draws
    n = (cfg["img_size"] // 8) ** 2 + (cfg.get("global_pool") == "token") + cfg.get("dist_token", 0)
    assert all(a.shape == (3, 4, n, n) for a in attns)
    torch.testing.assert_close(attns[0].sum(-1), torch.ones(3, 4, n))
    mask = model.attn_mask_for(((cfg["img_size"] // 8),) * 2, x.device, n)
    if mask is not None:
        assert (attns[0][:, :, ~mask] == 0).all()  # nothing leaks outside the pattern


def test_conv_stem_matches_its_formula_and_keeps_the_token_grid():
    model = VisionTransformer(**{**SMALL, "stem": "conv", "embed_dim": 64}).eval()
    stem = model.patch_embed.stem
    convs = [m for m in stem if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [16, 32, 64] and all(c.stride == (2, 2) for c in convs)  # patch 8
    for m in stem:  # BatchNorm statistics other than the initial ones: the formula must use them
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1), m.running_var.uniform_(0.5, 2), m.weight.data.uniform_(0.5, 2)
    x = torch.randn(2, 3, 32, 32)
    ref = x
    for conv, bn in zip(convs, [m for m in stem if isinstance(m, torch.nn.BatchNorm2d)]):
        ref = F.conv2d(ref, conv.weight, stride=2, padding=1)
        ref = (ref - bn.running_mean[:, None, None]) / torch.sqrt(bn.running_var[:, None, None] + bn.eps)
        ref = F.relu(ref * bn.weight[:, None, None] + bn.bias[:, None, None])
    ref = F.conv2d(ref, model.patch_embed.proj.weight, model.patch_embed.proj.bias)  # 1x1 to embed_dim
    tokens, grid = model.patch_embed(x)
    assert grid == (4, 4) and tokens.shape == (2, 16, 64)
    torch.testing.assert_close(tokens, ref.flatten(2).transpose(1, 2), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="stem='conv' needs a power-of-2 patch_size"):
        ViTConfig(img_size=48, patch_size=12, stem="conv")


def test_resnet_stem_gives_timms_hybrid_embedding_of_residual_stages():
    """stem='resnet': timm's HybridEmbed (the ViT paper's hybrid) over the same backbone and 1x1 projection gives the
    same tokens; the backbone is a first convolution, then a residual stage of timm's BasicBlock per halving."""
    from timm.layers import HybridEmbed
    from timm.models.resnet import BasicBlock

    model = VisionTransformer(**{**SMALL, "stem": "resnet", "embed_dim": 64}).eval()
    stem = model.patch_embed.stem
    blocks = [m for m in stem if isinstance(m, BasicBlock)]
    assert stem[0].stride == (2, 2) and [b.conv1.out_channels for b in blocks] == [32, 64]  # patch 8: 3 halvings
    assert all(b.conv1.stride == (2, 2) and b.downsample is not None for b in blocks)
    for m in stem.modules():  # statistics other than the initial ones: both must use them
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1), m.running_var.uniform_(0.5, 2), m.weight.data.uniform_(0.5, 2)
    timms = HybridEmbed(stem, img_size=32, patch_size=1, in_chans=3, embed_dim=64).eval()
    timms.proj.load_state_dict(model.patch_embed.proj.state_dict())
    x = torch.randn(2, 3, 32, 32)
    tokens, grid = model.patch_embed(x)
    assert grid == (4, 4) and timms.grid_size == (4, 4)
    torch.testing.assert_close(tokens, timms(x), atol=1e-6, rtol=0)
    ref = stem[2](stem[1](stem[0](x)))  # a residual stage by its formula: relu(bn2(conv2(relu(bn1(conv1 x)))) + short)
    for b in blocks:
        ref = F.relu(b.bn2(b.conv2(F.relu(b.bn1(b.conv1(ref))))) + b.downsample(ref))
    torch.testing.assert_close(stem(x), ref, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="stem='resnet' needs a power-of-2 patch_size"):
        ViTConfig(img_size=48, patch_size=12, stem="resnet")


def test_mimetic_init_gives_the_papers_products_and_attention_to_self():
    torch.manual_seed(0)
    D, H = 96, 3
    attn = VisionTransformer(**{**SMALL, "embed_dim": D, "num_heads": H, "weight_init": "mimetic"}).blocks[0].attn
    wq, wk, wv = attn.qkv.weight.detach().split(D)  # (D, D) each, rows grouped by head
    qk = [wq[h * 32 : (h + 1) * 32].T @ wk[h * 32 : (h + 1) * 32] for h in range(H)]  # W_q^h^T W_k^h (D, D)
    for m in qk:  # a rank-32 part of 0.7 Z + 0.7 I: the identity dominates the trace, not the off-diagonal
        assert m.diagonal().mean() > 0.2 and (m - torch.diag(m.diagonal())).abs().mean() < 0.1
    vo = attn.proj.weight.detach() @ wv  # W_proj W_v = 0.4 Z - 0.4 I exactly (full rank)
    assert abs(vo.diagonal().mean() + 0.4) < 0.05
    assert abs((vo + 0.4 * torch.eye(D)).std() - 0.4 / D**0.5) < 0.01
    assert (attn.qkv.bias == 0).all() and (attn.proj.bias == 0).all()

    # at initialisation a token attends to itself far more than with timm's init (uniform would be 1/16)
    x = torch.randn(4, 3, 32, 32)
    diag = {}
    for init in ("", "mimetic"):
        torch.manual_seed(1)
        model = VisionTransformer(**{**SMALL, "embed_dim": D, "num_heads": H, "weight_init": init}).eval()
        attns, _ = capture_attention(model, x)
        diag[init] = attns[0].diagonal(dim1=-2, dim2=-1).mean().item()
    assert diag["mimetic"] > 3 * diag[""] and diag[""] < 2 / 16
    with pytest.raises(ValueError, match="weight_init='mimetic' needs plain attention"):
        ViTConfig(embed_dim=64, num_heads=4, num_kv_heads=2, weight_init="mimetic")
    with pytest.raises(ValueError, match="weight_init='jax' is not one of"):
        ViTConfig(weight_init="jax")


def test_swiglu_keeps_the_parameter_count_and_matches_its_formula():
    mlp = Block(ViTConfig(embed_dim=48, num_heads=4, mlp_layer="mlp")).mlp
    glu = Block(ViTConfig(embed_dim=48, num_heads=4, mlp_layer="swiglu")).mlp
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert abs(count(glu) - count(mlp)) / count(mlp) < 0.02
    x = torch.randn(2, 5, 48)
    ref = glu.fc2(F.silu(glu.fc1_g(x)) * glu.fc1_x(x))
    torch.testing.assert_close(glu(x), ref)


def test_rmsnorm_matches_its_formula():
    model = VisionTransformer(**SMALL, norm_layer="rmsnorm")
    norm = model.blocks[0].norm1
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 5, 32)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    torch.testing.assert_close(norm(x), ref)
    assert isinstance(model.blocks[0].attn.q_norm, torch.nn.RMSNorm)


def test_post_norm_block_matches_its_formula():
    blk = build_block(ViTConfig(embed_dim=32, num_heads=4, norm_position="post")).eval()
    x = torch.randn(2, 5, 32)
    h = blk.norm1(x + blk.attn(x))
    torch.testing.assert_close(blk(x), blk.norm2(h + blk.mlp(h)))


# Each variant's config trains from the command line and its checkpoint loads back: tests/test_configs.py.


def test_rope_2d_scores_depend_only_on_the_offset_between_patches():
    grid, hd = (4, 5), 16
    cos, sin = rope_2d(grid, hd)
    torch.manual_seed(0)
    q = apply_rope(torch.randn(hd).expand(20, hd), cos, sin)  # the same query vector at every patch
    k = apply_rope(torch.randn(hd).expand(20, hd), cos, sin)
    scores = q @ k.T  # (20, 20)
    pos = [divmod(i, 5) for i in range(20)]
    by_offset = {}
    for i in range(20):
        for j in range(20):
            offset = (pos[i][0] - pos[j][0], pos[i][1] - pos[j][1])
            by_offset.setdefault(offset, []).append(scores[i, j])
    for values in by_offset.values():
        torch.testing.assert_close(torch.stack(values), values[0].expand(len(values)), atol=1e-5, rtol=0)
    assert len({round(v[0].item(), 4) for v in by_offset.values()}) > 20  # and the offset does matter
    # norms are kept: a rotation
    torch.testing.assert_close(q.norm(dim=-1), torch.full((20,), q[0].norm().item()))


def test_rope_with_and_without_the_absolute_embedding():
    for cfg in (
        {"pos_embed": "rope2d"},
        {"pos_embed": "learned", "rope": True},
        {"rope": True, "global_pool": "token"},
    ):
        model = VisionTransformer(**SMALL, **cfg)
        assert (model.pos_embed is None) == (cfg.get("pos_embed") == "rope2d")
        x = torch.randn(2, 3, 32, 32)
        model.set_fused_attn(True)
        a = model(x)
        model.set_fused_attn(False)
        torch.testing.assert_close(a, model(x), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="2D RoPE needs a head size divisible by 4"):
        VisionTransformer(**{**SMALL, "embed_dim": 24, "num_heads": 4}, pos_embed="rope2d")


def test_latent_attention_matches_its_formula_and_stores_less():
    attn = LatentAttention(32, num_heads=4, kv_latent_dim=8).eval()
    x = torch.randn(2, 6, 32)
    latent = attn.kv_norm(attn.kv_down(x))  # (B, N, 8): all that keys and values are made of
    k, v = attn.kv_up(latent).split(32, dim=-1)
    q = attn.q_norm(attn.q(x).reshape(2, 6, 4, 8).transpose(1, 2))
    k = attn.k_norm(k.reshape(2, 6, 4, 8).transpose(1, 2))
    v = v.reshape(2, 6, 4, 8).transpose(1, 2)
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1)
    ref = attn.proj((w @ v).transpose(1, 2).reshape(2, 6, 32))
    for fused in (True, False):
        attn.fused_attn = fused
        torch.testing.assert_close(attn(x), ref, atol=1e-5, rtol=0)
    per_token_cache = latent.shape[-1]
    assert per_token_cache == 8 < 2 * 32  # a latent of 8 per token instead of 64 key and value numbers


def test_shifted_patch_tokens_match_the_papers_shifts_and_layout():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 16, 16)
    p, s = 8, 4
    tokens = shifted_patches(x, p)  # (B, N, 5 C p^2)
    assert tokens.shape == (2, 4, 5 * 3 * 64)
    ref = [x]
    for dy, dx in ((s, s), (s, -s), (-s, s), (-s, -s)):  # content moved by (dy, dx), zeros where it leaves
        shifted = torch.zeros_like(x)
        for i in range(16):
            for j in range(16):
                if 0 <= i - dy < 16 and 0 <= j - dx < 16:
                    shifted[..., i, j] = x[..., i - dy, j - dx]
        ref.append(shifted)
    ref = torch.cat(ref, dim=1)  # (B, 5C, H, W)
    for n, (r, c) in enumerate(((0, 0), (0, 1), (1, 0), (1, 1))):  # row-major patches, (p1 p2 c) inside each
        patch = ref[:, :, r * p : (r + 1) * p, c * p : (c + 1) * p].permute(0, 2, 3, 1).reshape(2, -1)
        torch.testing.assert_close(tokens[:, n], patch)

    model = VisionTransformer(**{**SMALL, "stem": "spt"}).eval()
    emb = model.patch_embed
    out, grid = emb(torch.randn(2, 3, 32, 32))
    assert grid == (4, 4) and out.shape == (2, 16, 32)
    y = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(emb(y)[0], emb.proj(emb.norm(shifted_patches(y, 8))))
    assert model(y).shape == (2, 5)
    with pytest.raises(ValueError, match="stem='spt' shifts by half a patch"):
        ViTConfig(img_size=27, patch_size=9, stem="spt")


def test_locality_self_attention_masks_the_diagonal_and_learns_its_temperature():
    torch.manual_seed(0)
    model = VisionTransformer(**{**SMALL, "lsa": True}).eval()
    attn = model.blocks[0].attn
    assert attn.temperature.item() == pytest.approx(math.sqrt(8))
    with torch.no_grad():
        attn.temperature.fill_(0.5)  # another temperature: both paths and the reference must use it
    x = torch.randn(2, 3, 32, 32)
    fused = model(x)
    model.set_fused_attn(False)
    manual = model(x)
    torch.testing.assert_close(fused, manual, atol=1e-5, rtol=1e-5)
    attns, _ = capture_attention(model, x)
    assert (attns[0].diagonal(dim1=-2, dim2=-1) == 0).all()  # a token never attends to itself
    tokens = model.patch_embed(x)[0] + model.pos_embed
    q, k, v = attn.qkv_heads(model.blocks[0].norm1(tokens))
    logits = (q @ k.transpose(-2, -1)) / 0.5
    logits = logits.masked_fill(torch.eye(16, dtype=torch.bool), float("-inf"))
    torch.testing.assert_close(attns[0], logits.softmax(-1), atol=1e-5, rtol=1e-5)
    loss = model.train()(x).sum()
    loss.backward()
    assert attn.temperature.grad is not None and attn.temperature.grad != 0  # learned
    with pytest.raises(ValueError, match="nothing left to attend to"):
        ViTConfig(img_size=8, patch_size=8, lsa=True)


def test_lsa_with_patch_dropout_trains_each_kept_token_hidden_from_itself():
    """Patch dropout keeps a random subset of the tokens; LSA's mask is then of the kept tokens (its diagonal), not of
    the whole grid (which raised a size mismatch on the first training step)."""
    from vit.evaluation.attention_maps import capture_attention

    model = VisionTransformer(**{**SMALL, "stem": "spt", "lsa": True, "patch_drop_rate": 0.5}).train()
    x = torch.randn(3, 3, SMALL["img_size"], SMALL["img_size"])
    model(x).sum().backward()  # the first training step
    kept = model.patch_drop(torch.zeros(1, (SMALL["img_size"] // 8) ** 2, 4)).shape[1]
    mask = model.attn_mask_for((SMALL["img_size"] // 8,) * 2, x.device, kept)
    assert mask.shape == (kept, kept) and not mask.diagonal().any() and mask.sum() == kept * (kept - 1)
    attns, _ = capture_attention(model.eval(), x)  # evaluation: every token, the grid's mask
    assert all(torch.equal(a.diagonal(dim1=-2, dim2=-1), torch.zeros_like(a.diagonal(dim1=-2, dim2=-1))) for a in attns)


def test_rope_in_bfloat16_weights_runs_and_stays_close_to_float32():
    """pos_embed rope2d with the whole model in bf16 (--trainer.precision bf16-true): the rotation tables follow q's
    dtype (float32 tables promoted q and k: 'Expected query, key, and value to have the same dtype')."""
    model = VisionTransformer(**{**SMALL, "pos_embed": "rope2d"}).eval()
    x = torch.randn(2, 3, SMALL["img_size"], SMALL["img_size"])
    with torch.no_grad():
        ref = model(x)
        out = model.to(torch.bfloat16)(x.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16
    # bf16 keeps 8 bits of mantissa: a few hundredths of the logits' scale (an absolute 0.1 was the logits' own size)
    scale = ref.abs().max()
    assert scale > 0 and (out.float() - ref).abs().max() <= 0.05 * scale


def test_the_distillation_token_gives_timms_deit_and_the_mean_of_two_heads():
    """dist_token with a class token: timm's VisionTransformerDistilled (DeiT) with the same weights gives the same
    answer (the mean of the two heads) and, in distilled training, the same two heads; with mean pooling the class
    head reads the patches' mean and the distillation head the token after the patches' prefix."""
    from timm.models.deit import VisionTransformerDistilled

    torch.manual_seed(0)
    ours = VisionTransformer(**{**SMALL, "global_pool": "token", "dist_token": True}).eval()
    assert ours.num_prefix_tokens == 2 and ours.dist_token.std() > 0.005  # trunc-normal(0.02), as timm's
    timms = VisionTransformerDistilled(img_size=32, patch_size=8, num_classes=5, embed_dim=32, depth=2, num_heads=4,
                                       qk_norm=True, global_pool="token").eval()  # fmt: skip
    sd = {k: v for k, v in ours.state_dict().items() if k != "pos_embed"}
    # timm's pos_embed covers the two prefix tokens too: zero there, ours on the patches
    sd["pos_embed"] = torch.cat([torch.zeros(1, 2, 32), ours.pos_embed.detach()], dim=1)
    timms.load_state_dict(sd)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), timms(x), atol=1e-5, rtol=0)
        timms.set_distilled_training(True)
        timms.train()
        heads = ours.forward_heads(ours.forward_features(x))
        for a, b in zip(heads, timms(x), strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    avg = VisionTransformer(**{**SMALL, "dist_token": True}).eval()
    with torch.no_grad():
        tokens = avg.forward_features(x)  # (B, 1 + N, D): the distillation token, then the patches
        assert tokens.shape == (3, 1 + 16, 32)
        expected = (avg.head(tokens[:, 1:].mean(1)) + avg.head_dist(tokens[:, 0])) / 2
        torch.testing.assert_close(avg(x), expected)
