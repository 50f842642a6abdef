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
A state dict alone does not say how many heads it has (ViT-H/14 has 16 heads of 80, not 20 of 64): pass `num_heads`
unless the qk_norm weights give the head size away; `vit.model.pretrained` also reads timm's config.json and registry.
"""

from pathlib import Path

import torch
import torch.nn as nn
from timm.layers import Mlp, resample_abs_pos_embed, resample_patch_embed

from vit.model.config import ViTConfig
from vit.model.vision_transformer import VisionTransformer


class InteropError(ValueError):
    """Weights that cannot be converted; the message names the file or the key."""


def load_state_dict(source: str | Path | dict) -> dict[str, torch.Tensor]:
    """A timm state dict from a dict, a `.safetensors` or a `.pth/.pt/.bin` file (read as data, no pickled code)."""
    if isinstance(source, dict):
        sd = source
    else:
        text = str(source)
        path = Path(text)
        if not path.exists():
            raise InteropError(f"{text}: no such weights file")
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            sd = load_file(str(path))
        else:
            try:
                sd = torch.load(path, map_location="cpu", weights_only=True)
            except Exception as e:  # damaged or pickled objects: one line either way
                raise InteropError(f"{path}: not a readable weights file ({str(e).strip().splitlines()[0]})") from None
    for key in ("state_dict", "model", "state_dict_ema"):  # common wrappers
        if isinstance(sd.get(key), dict):
            sd = sd[key]
            break
    sd = {k.removeprefix("module."): v for k, v in sd.items()}
    if "patch_embed.proj.weight" not in sd:
        raise InteropError(
            f"{source if not isinstance(source, dict) else 'state dict'}: not a timm ViT (no patch_embed.proj.weight)"
        )
    return sd


def config_from_state_dict(sd: dict[str, torch.Tensor], num_heads: int | None = None) -> dict:
    """The `ViTConfig` fields of a timm ViT state dict, as a dict (shapes tell all but the head count)."""
    if any(k.startswith("reg_token") for k in sd) or "attn_pool.latent" in sd:
        raise InteropError("register tokens and attention pooling have no counterpart in this model")
    w = sd["patch_embed.proj.weight"]  # (D, C, p, p)
    embed_dim, in_chans, patch = w.shape[0], w.shape[1], w.shape[-1]
    depth = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    has_cls = "cls_token" in sd
    avg = "fc_norm.weight" in sd or not has_cls
    if has_cls and avg:
        raise InteropError(
            "a class token with average pooling has no counterpart here (our avg model has no class token)"
        )
    q_norm = sd.get("blocks.0.attn.q_norm.weight")
    if num_heads is None and q_norm is not None:
        num_heads = embed_dim // q_norm.shape[0]
    if num_heads is None:  # every shape would match with any divisor of embed_dim, and the logits would not
        raise InteropError("the weights do not say how many attention heads they have (no qk_norm): pass num_heads")
    n_pos = sd["pos_embed"].shape[1]
    if has_cls and round(n_pos**0.5) ** 2 != n_pos:  # timm's default layout: one position for the class token
        n_pos -= 1
    grid = round(n_pos**0.5)
    if grid * grid != n_pos:
        raise InteropError(f"pos_embed of {sd['pos_embed'].shape[1]} tokens is not a square grid")
    return dict(
        img_size=grid * patch,
        patch_size=patch,
        in_chans=in_chans,
        num_classes=sd["head.weight"].shape[0] if "head.weight" in sd else 0,
        embed_dim=embed_dim,
        depth=depth,
        num_heads=num_heads,
        mlp_ratio=sd["blocks.0.mlp.fc1.weight"].shape[0] / embed_dim,
        qkv_bias="blocks.0.attn.qkv.bias" in sd,
        qk_norm="blocks.0.attn.q_norm.weight" in sd,
        global_pool="avg" if avg else "token",
        fc_norm="fc_norm.weight" in sd,
        init_values=1e-5 if "blocks.0.ls1.gamma" in sd else None,  # the value is overwritten by the weights
    )


def convert_from_timm(
    sd: dict[str, torch.Tensor], cfg: dict, img_size: int | None = None, patch_size: int | None = None
) -> dict[str, torch.Tensor]:
    """timm state dict -> ours: class-token position folded, optional resampling to a new image or patch size."""
    sd = dict(sd)
    old_grid = (cfg["img_size"] // cfg["patch_size"],) * 2
    pe = sd.pop("pos_embed")
    if "cls_token" in sd and pe.shape[1] == old_grid[0] * old_grid[1] + 1:  # timm's default: pos covers the cls
        sd["cls_token"] = sd["cls_token"] + pe[:, :1]
        pe = pe[:, 1:]
    new_patch = patch_size or cfg["patch_size"]
    if new_patch != cfg["patch_size"]:  # FlexiViT's pseudo-inverse resize of the patch kernel
        sd["patch_embed.proj.weight"] = resample_patch_embed(sd["patch_embed.proj.weight"], [new_patch, new_patch])
    new_grid = ((img_size or cfg["img_size"]) // new_patch,) * 2
    sd["pos_embed"] = resample_abs_pos_embed(pe, list(new_grid), list(old_grid), num_prefix_tokens=0)
    return sd


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
        from vit.model.pretrained import find_pretrained  # (pretrained.py builds on this module)

        weights = find_pretrained(source, num_heads)
        sd, cfg = weights.state_dict, weights.arch
    sd = convert_from_timm(sd, cfg, img_size, patch_size)
    new_classes = cfg["num_classes"] if num_classes is None else num_classes
    if new_classes != cfg["num_classes"]:
        sd.pop("head.weight", None), sd.pop("head.bias", None)
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
    allowed = {"head.weight", "head.bias"} if new_classes != cfg["num_classes"] else set()
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
    if (
        blk.attn.num_kv_heads != blk.attn.num_heads
        or blk.post_norm
        or model.attn_pattern[0] != "global"
        or not isinstance(blk.mlp, Mlp)
        or model.use_rope
        or blk.attn.kv_latent_dim
        or model.cfg.stem != "patch"
        or model.cfg.lsa
    ):
        raise InteropError(
            "timm's VisionTransformer has no grouped-query or latent attention, attention patterns, Post-Norm, "
            "RoPE, SwiGLU, MoE, convolutional or shifted-patch stem, or LSA here: only the plain model converts"
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
