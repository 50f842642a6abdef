"""timm interoperability: our VisionTransformer from timm's weights, and back, with the same logits.

    model = from_timm("vit_small_patch16_224.safetensors", num_classes=10)   # a file, a timm name, a state dict or
                                                                             # a timm model
    model = from_timm(timm_model, img_size=384)                              # position embeddings resampled
    timm_model = to_timm(model)                                              # and back: same logits

Our module names are timm's, so most tensors copy one to one. What differs:
- timm's default `pos_embed` also covers the class token (no_embed_class=False). timm adds it to the class token
  before the blocks, so we fold it into our `cls_token`: cls + pos_embed[:, 0] gives the same activations.
- Our average-pooling model has no class token; a timm model with both a class token and average pooling has no
  counterpart here and is refused with a clear error.
- DeiT's distilled models (timm's VisionTransformerDistilled: a distillation token after the class token, its own
  head `head_dist`) load as `dist_token: true`, answering the mean of the two heads as timm does in eval; both tokens'
  positions fold into the tokens. Back to timm, only the plain model converts.
A state dict alone does not say how many heads it has (ViT-H/14 has 16 heads of 80, not 20 of 64): pass `num_heads`
unless the qk_norm weights give the head size away; `vit.model.pretrained` also reads timm's config.json and registry.
"""

import torch.nn as nn
from timm.layers import Mlp

from vit.model.config import ViTConfig
from vit.model.pretrained import find_pretrained
from vit.model.timm_state import InteropError, config_from_state_dict, convert_from_timm, load_state_dict
from vit.model.vision_transformer import Attention, VisionTransformer

__all__ = ["InteropError", "from_timm", "load_state_dict", "timm_args", "to_timm"]


def from_timm(
    source,
    num_classes: int | None = None,
    img_size: int | None = None,
    patch_size: int | None = None,
    num_heads: int | None = None,
) -> VisionTransformer:
    """Our model with timm's weights (a timm model, a state dict, or a weights file).

    Args:
        num_classes: a new head (freshly initialised) when it differs from the weights'.
        img_size, patch_size: resample the position embeddings (bicubic, as timm) and the patch kernel (FlexiViT).
    """
    if isinstance(source, nn.Module):
        num_heads = num_heads or source.blocks[0].attn.num_heads
        source = source.state_dict()
    if isinstance(source, dict):
        sd = load_state_dict(source)
        cfg = config_from_state_dict(sd, num_heads)
    else:  # a file or a timm name: its config.json or timm's registry knows the head count
        weights = find_pretrained(source, num_heads)
        sd, cfg = weights.state_dict, weights.arch
    sd = convert_from_timm(sd, cfg, img_size, patch_size)
    new_classes = cfg["num_classes"] if num_classes is None else num_classes
    heads = {"head.weight", "head.bias"} | ({"head_dist.weight", "head_dist.bias"} if cfg.get("dist_token") else set())
    if new_classes != cfg["num_classes"]:
        sd = {k: v for k, v in sd.items() if k not in heads}
    arch = ViTConfig(
        **{
            **cfg,
            "img_size": img_size or cfg["img_size"],
            "patch_size": patch_size or cfg["patch_size"],
            "num_classes": new_classes,
        }
    )
    model = VisionTransformer(arch)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    allowed = heads if new_classes != cfg["num_classes"] else set()
    if set(missing) - allowed or unexpected:
        raise InteropError(
            f"weights do not fit: missing {sorted(set(missing) - allowed)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )
    return model


def to_timm(model: VisionTransformer):
    """A timm VisionTransformer with our model's weights and the same logits (pos_embed learned, patches only)."""
    import timm

    out = timm.models.VisionTransformer(**timm_args(model))
    sd = model.state_dict()
    sd["pos_embed"] = model.pos_embed.detach().clone()  # sincos2d is a buffer, not in the state dict
    out.load_state_dict(sd, strict=True)
    return out.eval()


def timm_args(model: VisionTransformer) -> dict:
    """The keyword arguments of timm's VisionTransformer that build our model (plain JSON: they go into the
    config.json of `vit-export --format timm`). Raises InteropError for a variant timm does not have."""
    blk = model.blocks[0]
    if model.cfg.stem != "patch":
        raise InteropError(
            f"stem={model.cfg.stem!r}: timm's VisionTransformer has no such stem (its patch embedding is one strided "
            "convolution; only the plain model converts): --format onnx or torchscript exports this model"
        )
    if (
        blk.attn.num_kv_heads != blk.attn.num_heads
        or blk.post_norm
        or model.attn_pattern[0] != "global"
        or not isinstance(blk.mlp, Mlp)
        or model.use_rope
        or type(blk.attn) is not Attention  # latent attention, LSA
        or model.cfg.lsa
        or model.cfg.dist_token
    ):
        raise InteropError(
            "timm's VisionTransformer has no grouped-query or latent attention, attention patterns, Post-Norm, "
            "RoPE, SwiGLU, MoE, convolutional or shifted-patch stem, LSA or a distillation token "
            "here: only the plain model converts"
        )
    return dict(
        img_size=model.grid_size[0] * model.patch_embed.patch_size,
        patch_size=model.patch_embed.patch_size,
        in_chans=model.patch_embed.in_chans,
        num_classes=model.num_classes,
        global_pool=model.global_pool,
        embed_dim=model.embed_dim,
        depth=len(model.blocks),
        num_heads=blk.attn.num_heads,
        mlp_ratio=blk.mlp.fc1.out_features / model.embed_dim,
        qkv_bias=blk.attn.qkv.bias is not None,
        qk_norm=not isinstance(blk.attn.q_norm, nn.Identity),
        init_values=1e-5 if not isinstance(blk.ls1, nn.Identity) else None,
        class_token=model.cls_token is not None,
        no_embed_class=True,  # our position embedding covers the patches only
        fc_norm=not isinstance(model.fc_norm, nn.Identity),
        # timm's LayerNorm and RmsNorm, eps 1e-6 both, as ours (vit/model/layers.py)
        norm_layer="rmsnorm" if isinstance(blk.norm1, nn.RMSNorm) else "layernorm",
    )
