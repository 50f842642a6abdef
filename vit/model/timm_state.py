"""timm state dicts as data: read from a file (safetensors, or torch files without pickled code), their
architecture read from the shapes, and their keys converted to this model's (the class and distillation tokens'
positions folded, the position embeddings and the patch kernel resampled). vit/model/interop.py and
vit/model/pretrained.py build on it.
"""

from pathlib import Path

import torch
from timm.layers import resample_abs_pos_embed, resample_patch_embed


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
    has_cls, dist = "cls_token" in sd, "dist_token" in sd  # dist_token: DeiT's distilled models
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
    if has_cls and round(n_pos**0.5) ** 2 != n_pos:  # timm's default layout: a position for each prefix token
        n_pos -= 1 + dist
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
        dist_token=dist,
    )


def convert_from_timm(
    sd: dict[str, torch.Tensor], cfg: dict, img_size: int | None = None, patch_size: int | None = None
) -> dict[str, torch.Tensor]:
    """timm state dict -> ours: the prefix tokens' positions folded, optional resampling to a new image or patch
    size."""
    sd = dict(sd)
    old_grid = (cfg["img_size"] // cfg["patch_size"],) * 2
    pe = sd.pop("pos_embed")
    prefix = [k for k in ("cls_token", "dist_token") if k in sd]  # timm's order: class token, distillation token
    if prefix and pe.shape[1] == old_grid[0] * old_grid[1] + len(prefix):  # timm's default: pos covers them
        for i, k in enumerate(prefix):  # timm adds the position to the token before the blocks: the same sum
            sd[k] = sd[k] + pe[:, i : i + 1]
        pe = pe[:, len(prefix) :]
    new_patch = patch_size or cfg["patch_size"]
    if new_patch != cfg["patch_size"]:  # FlexiViT's pseudo-inverse resize of the patch kernel
        sd["patch_embed.proj.weight"] = resample_patch_embed(sd["patch_embed.proj.weight"], [new_patch, new_patch])
    new_grid = ((img_size or cfg["img_size"]) // new_patch,) * 2
    sd["pos_embed"] = resample_abs_pos_embed(pe, list(new_grid), list(old_grid), num_prefix_tokens=0)
    return sd
