"""Layers the model composes that have no parameters of their own: norms by name, fixed 2D position embeddings,
2D rotary embeddings, the boolean attention masks of the local / dilated / sparse patterns, and the factors of the
mimetic initialisation.

Pure functions of sizes; `vit/model/vision_transformer.py` calls them once per input grid and caches the result.
"""

from functools import partial

import torch
import torch.nn as nn


def get_norm_layer(name: str) -> type[nn.Module]:
    """The norm class for a config name. eps=1e-6 as timm's ViTs (torch's 1e-5 breaks exact timm parity)."""
    norms = {"layernorm": partial(nn.LayerNorm, eps=1e-6), "rmsnorm": partial(nn.RMSNorm, eps=1e-6)}
    if name not in norms:
        raise ValueError(f"norm_layer={name!r} is not one of {sorted(norms)}")
    return norms[name]


def sincos_2d_pos_embed(grid_h: int, grid_w: int, dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """Fixed 2D sine-cosine position embedding of "Better plain ViT baselines" (big_vision's posemb_sincos_2d).

    A quarter of the channels each: sin(x), cos(x), sin(y), cos(y). Returns (1, grid_h * grid_w, dim), row-major.
    """
    if dim % 4 != 0:
        raise ValueError(f"embed_dim={dim} must be divisible by 4 for pos_embed='sincos2d'")
    y, x = torch.meshgrid(
        torch.arange(grid_h, dtype=torch.float32), torch.arange(grid_w, dtype=torch.float32), indexing="ij"
    )
    omega = torch.arange(dim // 4, dtype=torch.float32) / max(dim // 4 - 1, 1)
    omega = 1.0 / temperature**omega  # (dim/4,)
    y = y.flatten()[:, None] * omega[None, :]  # (N, dim/4)
    x = x.flatten()[:, None] * omega[None, :]
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)[None]


def rope_2d(grid: tuple[int, int], head_dim: int, theta: float = 100.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Axial 2D rotary embedding: cos and sin of (N, head_dim). The first half of each head's channels turns with the
    patch row, the second half with its column, so q.k depends on the offset between two patches, not on where they
    are. theta 100 (not 10000): a grid of a few dozen positions needs no slower frequencies."""
    quarter = head_dim // 4
    inv_freq = 1.0 / theta ** (torch.arange(quarter, dtype=torch.float32) / quarter)  # (Dh/4,)
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    ang_r = rows.flatten()[:, None].float() * inv_freq  # (N, Dh/4)
    ang_c = cols.flatten()[:, None].float() * inv_freq
    angles = torch.cat([ang_r, ang_r, ang_c, ang_c], dim=-1)  # (N, Dh): rotate-half pairs inside each axis half
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (..., N, Dh) by rope_2d's angles: in each axis half [a, b] -> [a cos - b sin, b cos + a sin]."""
    x1, x2, x3, x4 = x.split(x.shape[-1] // 4, dim=-1)
    return x * cos + torch.cat([-x2, x1, -x4, x3], dim=-1) * sin


def attention_pattern_mask(
    grid: tuple[int, int],
    pattern: str,
    window: int = 3,
    dilation: int = 2,
    global_tokens: int = 1,
    num_prefix_tokens: int = 0,
) -> torch.Tensor:
    """Which token may attend to which, over a 2D patch grid: (T, T) bool, T = prefix + gh * gw, True = allowed.

    local: a window x window square around the query patch. dilated: the patches at multiples of `dilation` rows
    and columns away (atrous). sparse: local or dilated, plus `global_tokens` global patches (the first, row-major)
    that attend to and are attended by every patch. Prefix tokens (the class token) are always global.
    """
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    dr = rows.flatten()[:, None] - rows.flatten()[None, :]  # (N, N) row offset of key from query
    dc = cols.flatten()[:, None] - cols.flatten()[None, :]
    local = (dr.abs() <= window // 2) & (dc.abs() <= window // 2)
    dilated = (dr % dilation == 0) & (dc % dilation == 0)
    if pattern == "local":
        allowed = local
    elif pattern == "dilated":
        allowed = dilated
    elif pattern == "sparse":
        glob = torch.arange(dr.shape[0]) < global_tokens
        allowed = local | dilated | glob[None, :] | glob[:, None]
    elif pattern == "global":
        allowed = torch.ones_like(local)
    else:
        raise ValueError(f"attn_pattern={pattern!r} is not one of ['global', 'local', 'dilated', 'sparse']")
    p = num_prefix_tokens
    mask = torch.ones(p + dr.shape[0], p + dr.shape[0], dtype=torch.bool)
    mask[p:, p:] = allowed
    return mask


def mimetic_factors(dim: int, *, alpha: float, beta: float, generator: torch.Generator | None = None):
    """L, R (dim, dim) with L @ R = alpha Z + beta I, Z ~ N(0, 1/dim) (Trockman & Kolter 2023, "Mimetic initialization
    of self-attention layers"): the SVD U S V^T of the target split as L = U sqrt(S), R = sqrt(S) V^T. The first k
    columns of L and rows of R give its best rank-k approximation (one head's W_q^T and W_k)."""
    z = torch.randn(dim, dim, generator=generator) / dim**0.5
    u, s, vh = torch.linalg.svd(alpha * z + beta * torch.eye(dim))
    return u * s.sqrt(), s.sqrt()[:, None] * vh
