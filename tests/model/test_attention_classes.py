"""The attention and block variants as classes of their own (timm's layout), chosen from the config in one place:
build_attention and build_block (no class hands back another from __new__)."""

import copy

import pytest
import torch

from vit.model.attention import (
    Attention,
    LatentAttention,
    LatentLocalityAttention,
    LocalitySelfAttention,
    build_attention,
)
from vit.model.config import ViTConfig
from vit.model.vision_transformer import Block, PostNormBlock, VisionTransformer, build_block

SMALL = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=5)


def test_each_attention_variant_is_a_class_of_its_own_picked_by_the_config():
    """timm's style: the plain Attention holds no variant's parameters; the config's fields pick the subclass."""
    picks = {
        (None, False): Attention,
        (8, False): LatentAttention,
        (None, True): LocalitySelfAttention,
        (8, True): LatentLocalityAttention,
    }
    for (latent, lsa), cls in picks.items():
        model = VisionTransformer(**SMALL, kv_latent_dim=latent, lsa=lsa)
        assert all(type(blk.attn) is cls for blk in model.blocks)
        assert type(build_attention(ViTConfig(embed_dim=32, num_heads=4, kv_latent_dim=latent, lsa=lsa))) is cls
    assert type(Attention(32, num_heads=4)) is Attention  # a class builds itself, whatever the config
    with pytest.raises(TypeError):
        Attention(32, num_heads=4, kv_latent_dim=8)  # the plain class takes no variant's field
    plain = {name for name, _ in Attention(32, num_heads=4).named_parameters()}
    assert plain == {"qkv.weight", "qkv.bias", "q_norm.weight", "q_norm.bias", "k_norm.weight", "k_norm.bias",
                     "proj.weight", "proj.bias"}  # fmt: skip
    both = {name for name, _ in LatentLocalityAttention(32, num_heads=4, kv_latent_dim=8).named_parameters()}
    assert {"temperature", "kv_down.weight", "kv_up.weight", "q.weight"} <= both and "qkv.weight" not in both


def test_post_norm_is_a_block_class_of_its_own_with_the_same_parameter_names():
    pre = build_block(ViTConfig(embed_dim=32, num_heads=4))
    post = build_block(ViTConfig(embed_dim=32, num_heads=4, norm_position="post"))
    assert type(pre) is Block and type(post) is PostNormBlock and post.post_norm and not pre.post_norm
    assert list(pre.state_dict()) == list(post.state_dict())  # old Post-Norm checkpoints load by the same names
    model = VisionTransformer(**SMALL, norm_position="post", kv_latent_dim=8)
    assert all(type(blk) is PostNormBlock for blk in model.blocks)
    copied = copy.deepcopy(model)  # as the EMA copies the model: classes and weights kept
    assert [type(b) for b in copied.blocks] == [PostNormBlock] * 2
    assert all(type(b.attn) is LatentAttention for b in copied.blocks)
    x = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(copied.eval()(x), model.eval()(x))
