"""Class-specific relevance and the faithfulness measure."""

import pytest
import torch

from vit.evaluation.attention_maps import relevance
from vit.evaluation.faithfulness import MAPS, auc, curves, faithfulness, patch_scores
from vit.model.vision_transformer import VisionTransformer

A, B_ = 5, 10  # the two evidence patches of the hand-built model (row-major on its 4x4 grid)


def hand_built() -> VisionTransformer:
    """One block, two heads, 16 patches. Head 0 attends from every patch to patch A only, head 1 to patch B only (a
    positional marker in the keys, a constant in the queries); each carries its patch's content (mean intensity) to
    its own output channel, and class 0's logit reads head 0's channel, class 1's head 1's. So class 0 depends on
    patch A's content, class 1 on patch B's, and nothing else has a path to the logits but the residual."""
    D = 16
    m = VisionTransformer(
        img_size=16, patch_size=4, in_chans=1, num_classes=2, embed_dim=D, depth=1, num_heads=2, qk_norm=False
    ).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        for mod in m.modules():  # norms as identity-like scalers: weight 1, bias 0
            if isinstance(mod, torch.nn.LayerNorm):
                mod.weight.fill_(1.0)
        m.patch_embed.proj.weight[0, 0] = 1 / 16  # dim 0: the patch's mean intensity
        m.pos_embed[0, :, 1] = 1.0  # dim 1: a constant (queries)
        m.pos_embed[0, A, 2] = 1.0  # dim 2: marks patch A (keys of head 0)
        m.pos_embed[0, B_, 3] = 1.0  # dim 3: marks patch B (keys of head 1)
        qkv = m.blocks[0].attn.qkv.weight  # (3D, D): q rows 0..D-1 (head 0: 0..7, head 1: 8..15), then k, then v
        qkv[0, 1], qkv[D + 0, 2] = 30.0, 1.0  # head 0: q = const, k = marker A -> attention on A
        qkv[8, 1], qkv[D + 8, 3] = 30.0, 1.0  # head 1: q = const, k = marker B
        qkv[2 * D + 0, 0] = 1.0  # head 0's value: content
        qkv[2 * D + 8, 0] = 1.0  # head 1's value: content
        proj = m.blocks[0].attn.proj.weight
        proj[12, 0], proj[13, 8] = 1.0, 1.0  # head 0 -> dim 12, head 1 -> dim 13
        m.head.weight[0, 12], m.head.weight[1, 13] = 1.0, 1.0
    return m


def images(n: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 1, 16, 16, generator=torch.Generator().manual_seed(seed)) + 0.5


def test_the_hand_built_model_reads_its_evidence_patches():
    """Brightening patch A raises class 0's logit, B class 1's; any other patch moves them far less (only through
    the residual and the final norm)."""
    m, x = hand_built(), images()
    base = m(x).detach()

    def delta(patch: int) -> torch.Tensor:
        bright = x.clone()
        r, c = divmod(patch, 4)
        bright[:, :, r * 4 : r * 4 + 4, c * 4 : c * 4 + 4] += 1.0
        return (m(bright) - base).detach()

    others = max(delta(p).abs().max().item() for p in range(16) if p not in (A, B_))
    assert (delta(A)[:, 0] > 5 * others).all() and (delta(B_)[:, 1] > 5 * others).all(), others


def test_relevance_ranks_the_evidence_patch_first_for_each_class():
    m, x = hand_built(), images()
    rel0, logits, _ = relevance(m, x, target=0)
    rel1, _, _ = relevance(m, x, target=1)
    assert (rel0.flatten(1).argmax(1) == A).all()
    assert (rel1.flatten(1).argmax(1) == B_).all()
    assert not torch.allclose(rel0, rel1)  # the evidence differs, and so do the maps
    assert torch.allclose(rel0.flatten(1).sum(1), torch.ones(len(x)))


def test_relevance_changes_no_parameter_gradient_and_restores_the_model():
    m = VisionTransformer(img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2).train()
    relevance(m, torch.randn(2, 3, 16, 16))
    assert all(p.grad is None for p in m.parameters())
    assert m.training and all(a.fused_attn for a in m.modules() if hasattr(a, "fused_attn"))


@pytest.mark.parametrize("pool", ["avg", "token"])
def test_batched_and_per_image_relevance_agree(pool):
    torch.manual_seed(0)
    m = VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=3, num_heads=4, global_pool=pool).eval()
    x = torch.randn(5, 3, 16, 16)
    batched, _, _ = relevance(m, x)
    single = torch.cat([relevance(m, x[i : i + 1])[0] for i in range(5)])
    torch.testing.assert_close(batched, single, rtol=1e-4, atol=1e-6)


VARIANTS = {
    "gqa": dict(num_heads=4, num_kv_heads=2),
    "mqa": dict(num_heads=4, num_kv_heads=1),
    "mla": dict(kv_latent_dim=8),
    "local": dict(attn_pattern="local"),
    "dilated": dict(attn_pattern="dilated"),
    "sparse": dict(attn_pattern="sparse"),
    "rope2d": dict(pos_embed="rope2d"),
    "swiglu": dict(mlp_layer="swiglu"),
    "rmsnorm": dict(norm_layer="rmsnorm"),
    "postnorm": dict(norm_position="post"),
    "moe": dict(moe_experts=3, moe_top_k=2),
    "token": dict(global_pool="token"),
    "dist": dict(dist_token=True),
    "efficientnet_stem": dict(stem="tf_efficientnet_lite0"),
}


@pytest.mark.parametrize("name", VARIANTS)
def test_every_variant_gives_finite_maps(name):
    torch.manual_seed(0)
    cfg = {"img_size": 16, "patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 2, **VARIANTS[name]}
    m = VisionTransformer(**cfg).eval()
    rel, logits, attns = relevance(m, torch.randn(3, 3, 16, 16))
    assert rel.shape == (3, 4, 4) and torch.isfinite(rel).all() and (rel >= 0).all()
    assert len(attns) == 2


def test_deletion_of_the_evidence_first_drops_the_probability_fastest():
    """The faithfulness measure on the hand-built model: relevance finds the evidence, so its deletion AUC is the
    lowest and its insertion AUC the highest of the five orders."""
    m, x = hand_built(), images(8)
    scores, classes = patch_scores(m, x)
    assert set(scores) == set(MAPS)
    result = faithfulness(m, x)
    assert result["relevance"]["deletion"] <= min(r["deletion"] for r in result.values()) + 1e-6
    assert result["relevance"]["deletion"] < result["random"]["deletion"]
    assert result["relevance"]["insertion"] > result["random"]["insertion"]


def test_curves_start_at_the_image_and_end_at_the_baseline():
    torch.manual_seed(0)
    m = VisionTransformer(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2).eval()
    x = torch.randn(3, 3, 16, 16)
    cls = m(x).argmax(-1)
    order = torch.rand(3, 16)
    d = curves(m, x, order, cls, "deletion")
    i = curves(m, x, order, cls, "insertion")
    p = m(x).softmax(-1).gather(1, cls[:, None])[:, 0]
    p0 = m(torch.zeros_like(x)).softmax(-1).gather(1, cls[:, None])[:, 0]
    torch.testing.assert_close(d[:, 0], p.detach())
    torch.testing.assert_close(d[:, -1], p0.detach())
    torch.testing.assert_close(i[:, 0], p0.detach())
    torch.testing.assert_close(i[:, -1], p.detach())
    assert d.shape == (3, 17) and torch.allclose(auc(torch.ones(2, 5)), torch.ones(2))


def test_the_faithfulness_command_prints_the_table_as_json(smoke_ckpt, tmp_path, capsys):
    """`vit-attention faithfulness --ckpt CKPT DIR --format json` (`--json`, its old name): every map, both curves,
    areas in [0, 1]."""
    import json

    from PIL import Image

    from vit.commands.attention import main

    ckpt = smoke_ckpt
    (tmp_path / "imgs").mkdir()
    for i in range(6):
        Image.fromarray((torch.rand(32, 32, 3) * 255).byte().numpy()).save(tmp_path / "imgs" / f"{i}.png")
    capsys.readouterr()
    assert main(["faithfulness", "--ckpt", str(ckpt), str(tmp_path / "imgs"), "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert main(["faithfulness", "--ckpt", str(ckpt), str(tmp_path / "imgs"), "--json"]) == 0  # the old name
    assert json.loads(capsys.readouterr().out) == result
    assert set(result) == {"relevance", "rollout", "last_block", "center", "random"}
    assert all(set(r) == {"deletion", "insertion"} and all(0 <= v <= 1 for v in r.values()) for r in result.values())
    assert main(["faithfulness", "--ckpt", str(tmp_path / "nope.ckpt"), str(tmp_path / "imgs")]) == 2
