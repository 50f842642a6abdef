"""A Vision Transformer in plain torch.nn: patches, 2D position embeddings, Pre-Norm blocks with QK-Norm, pooling.

No Lightning here: `vit/module.py` wraps this model for training. Submodule names follow timm's
`VisionTransformer` (`patch_embed.proj`, `pos_embed`, `blocks.N.attn.qkv`, `attn.q_norm`, `mlp.fc1`, `norm`, `head`)
so that state dicts map onto timm's one to one.

    model = VisionTransformer(img_size=32, patch_size=4, num_classes=10, embed_dim=192, depth=6, num_heads=3)
    logits = model(images)  # (B, 3, 32, 32) -> (B, 10)
"""

import math
from functools import partial
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import DropPath, LayerScale, Mlp, SwiGLU, resample_abs_pos_embed, trunc_normal_

from vit.moe import MoEMlp

NormName = Literal["layernorm", "rmsnorm"]
PosEmbedName = Literal["learned", "sincos2d", "rope2d"]
PoolName = Literal["avg", "token"]
AttnPattern = Literal["global", "local", "dilated", "sparse"]
MlpName = Literal["mlp", "swiglu"]
NormPosition = Literal["pre", "post"]


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
    else:
        raise ValueError(f"attn_pattern={pattern!r} is not one of ['global', 'local', 'dilated', 'sparse']")
    p = num_prefix_tokens
    mask = torch.ones(p + dr.shape[0], p + dr.shape[0], dtype=torch.bool)
    mask[p:, p:] = allowed
    return mask


class PatchEmbed(nn.Module):
    """Image to patch tokens with one strided convolution: (B, C, H, W) -> (B, N, D), N = (H/p) * (W/p)."""

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        H, W = x.shape[-2:]
        if H % self.patch_size or W % self.patch_size:
            raise ValueError(f"input size {H}x{W} is not divisible by patch_size={self.patch_size}")
        x = self.proj(x)  # (B, D, H/p, W/p)
        grid = (x.shape[-2], x.shape[-1])
        return x.flatten(2).transpose(1, 2), grid  # (B, N, D)


class Attention(nn.Module):
    """Multi-head self-attention with QK-Norm.

    `fused_attn` (per instance) picks `F.scaled_dot_product_attention` (FlashAttention / memory-efficient kernels on
    GPU, the flash kernel on CPU) or the manual `softmax(q k^T / sqrt(d)) v`, which materialises the weights: they pass
    through `attn_drop`, where `vit.attention_maps` reads them.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        qk_norm: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] = nn.LayerNorm,
        num_kv_heads: int | None = None,
        kv_latent_dim: int | None = None,
    ):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads or num_heads  # < num_heads: grouped-query attention; 1: multi-query
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused_attn = True
        kv_dim = self.num_kv_heads * self.head_dim
        self.kv_latent_dim = kv_latent_dim
        if kv_latent_dim:
            # Multi-head latent attention (DeepSeek-V2), non-causal: keys and values are up-projected from one shared
            # low-rank latent of each token, c = norm(W_down x); q comes from x directly (no decoupled RoPE here).
            self.q = nn.Linear(dim, num_heads * self.head_dim, bias=qkv_bias)
            self.kv_down = nn.Linear(dim, kv_latent_dim, bias=False)
            self.kv_norm = norm_layer(kv_latent_dim)
            self.kv_up = nn.Linear(kv_latent_dim, 2 * kv_dim, bias=qkv_bias)
        else:
            # q, then k and v for the kv heads only: [H * Dh | KV * Dh | KV * Dh] (timm's fused qkv when KV == H)
            self.qkv = nn.Linear(dim, num_heads * self.head_dim + 2 * kv_dim, bias=qkv_bias)
        # One norm over head_dim shared by all heads (timm's qk_norm), applied before the dot product.
        self.q_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def qkv_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, H, N, Dh) and k, v (B, KV, N, Dh), q and k normalised."""
        B, N, C = x.shape
        H, KV, Dh = self.num_heads, self.num_kv_heads, self.head_dim
        if self.kv_latent_dim:
            q = self.q(x)
            k, v = self.kv_up(self.kv_norm(self.kv_down(x))).split([KV * Dh, KV * Dh], dim=-1)  # (B, N, latent) up
        else:
            q, k, v = self.qkv(x).split([H * Dh, KV * Dh, KV * Dh], dim=-1)
        q = q.reshape(B, N, H, Dh).transpose(1, 2)  # (B, N, H * Dh) -> (B, H, N, Dh)
        k = k.reshape(B, N, KV, Dh).transpose(1, 2)
        v = v.reshape(B, N, KV, Dh).transpose(1, 2)
        return self.q_norm(q), self.k_norm(k), v

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, rope=None) -> torch.Tensor:
        """x (B, N, D); attn_mask (N, N) bool, True where a query may attend to a key; rope (cos, sin) of the
        patch tokens (prefix tokens such as the class token are not rotated)."""
        B, N, C = x.shape
        q, k, v = self.qkv_heads(x)
        if rope is not None:
            p = N - rope[0].shape[0]
            q = torch.cat([q[:, :, :p], apply_rope(q[:, :, p:], *rope)], dim=2)
            k = torch.cat([k[:, :, :p], apply_rope(k[:, :, p:], *rope)], dim=2)
        gqa = self.num_kv_heads != self.num_heads
        if self.fused_attn:
            # enable_gqa: SDPA shares each kv head across its group of query heads without copying it
            x = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, enable_gqa=gqa, dropout_p=self.attn_drop.p if self.training else 0.0
            )
        else:
            if gqa:
                group = self.num_heads // self.num_kv_heads
                k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, H, N, Dh)
            attn = (q * self.scale) @ k.transpose(-2, -1)  # (B, H, N, N)
            if attn_mask is not None:
                attn = attn.masked_fill(~attn_mask, float("-inf"))
            attn = self.attn_drop(attn.softmax(dim=-1))
            x = attn @ v
        x = x.transpose(1, 2).reshape(B, N, C)  # (B, H, N, Dh) -> (B, N, D)
        return self.proj_drop(self.proj(x))


class Block(nn.Module):
    """Transformer block: Pre-Norm x + attn(norm1(x)), then x + mlp(norm2(x)) (or Post-Norm), LayerScale, DropPath."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        qk_norm: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        init_values: float | None = None,
        norm_layer: type[nn.Module] = nn.LayerNorm,
        num_kv_heads: int | None = None,
        mlp_layer: str = "mlp",
        norm_position: str = "pre",
        moe_experts: int = 0,
        moe_top_k: int = 2,
        moe_capacity_factor: float = 1.25,
        kv_latent_dim: int | None = None,
    ):
        super().__init__()
        self.post_norm = norm_position == "post"
        self.norm1 = norm_layer(dim)
        self.attn = Attention(
            dim, num_heads, qkv_bias, qk_norm, attn_drop, proj_drop, norm_layer, num_kv_heads, kv_latent_dim
        )
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        hidden = int(dim * mlp_ratio)
        if moe_experts > 0:  # E experts of the dense MLP's size: each token pays for top_k of them
            self.mlp = MoEMlp(dim, hidden, moe_experts, moe_top_k, moe_capacity_factor, drop=proj_drop)
        elif mlp_layer == "swiglu":  # three matrices instead of two: 2/3 of the hidden size keeps the parameter count
            self.mlp = SwiGLU(dim, max(1, round(hidden * 2 / 3)), act_layer=nn.SiLU, drop=proj_drop)
        else:
            self.mlp = Mlp(dim, hidden, act_layer=nn.GELU, drop=proj_drop)
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, rope=None) -> torch.Tensor:
        if self.post_norm:  # the original Transformer's order: normalise after each residual sum
            x = self.norm1(x + self.drop_path1(self.ls1(self.attn(x, attn_mask, rope))))
            return self.norm2(x + self.drop_path2(self.ls2(self.mlp(x))))
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), attn_mask, rope)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class VisionTransformer(nn.Module):
    """ViT classifier. Argument names are timm's.

    Args:
        pos_embed: 'learned' (one trained vector per grid cell), 'sincos2d' (fixed), or 'rope2d' (no absolute
            embedding, 2D rotary in attention only). Another input resolution resamples the grid: bicubic for
            learned, recomputed for sincos2d and RoPE.
        rope: add 2D rotary position embedding in attention to a learned or sincos2d absolute embedding.
        global_pool: 'avg' averages the patch tokens (no class token); 'token' prepends a class token and reads it.
        fc_norm: apply the final norm after pooling instead of to every token before it (timm's `fc_norm`).
        init_values: LayerScale init; None turns LayerScale off.
    """

    def __init__(
        self,
        img_size: int = 32,
        patch_size: int = 4,
        in_chans: int = 3,
        num_classes: int = 10,
        embed_dim: int = 192,
        depth: int = 6,
        num_heads: int = 3,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        qk_norm: bool = True,
        norm_layer: NormName = "layernorm",
        pos_embed: PosEmbedName = "learned",
        global_pool: PoolName = "avg",
        fc_norm: bool = False,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        init_values: float | None = None,
        rope: bool = False,
        num_kv_heads: int | None = None,
        attn_pattern: AttnPattern = "global",
        attn_window: int = 3,
        attn_dilation: int = 2,
        attn_global_tokens: int = 1,
        mlp_layer: MlpName = "mlp",
        norm_position: NormPosition = "pre",
        moe_experts: int = 0,
        moe_top_k: int = 2,
        moe_capacity_factor: float = 1.25,
        kv_latent_dim: int | None = None,
    ):
        super().__init__()
        _check_config(
            img_size=img_size,
            patch_size=patch_size,
            in_chans=in_chans,
            num_classes=num_classes,
            embed_dim=embed_dim,
            depth=depth,
            num_heads=num_heads,
            mlp_ratio=mlp_ratio,
            pos_embed=pos_embed,
            global_pool=global_pool,
            drop_rate=drop_rate,
            attn_drop_rate=attn_drop_rate,
            drop_path_rate=drop_path_rate,
            init_values=init_values,
            num_kv_heads=num_kv_heads,
            rope=rope,
            attn_pattern=attn_pattern,
            attn_window=attn_window,
            attn_dilation=attn_dilation,
            attn_global_tokens=attn_global_tokens,
            mlp_layer=mlp_layer,
            norm_position=norm_position,
            moe_experts=moe_experts,
            moe_top_k=moe_top_k,
            moe_capacity_factor=moe_capacity_factor,
            kv_latent_dim=kv_latent_dim,
        )
        norm = get_norm_layer(norm_layer)
        self.num_classes = num_classes
        self.embed_dim = embed_dim
        self.global_pool = global_pool
        self.grid_size = (img_size // patch_size, img_size // patch_size)
        self.num_prefix_tokens = 1 if global_pool == "token" else 0
        self.pos_embed_type = pos_embed

        self.patch_embed = PatchEmbed(patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if global_pool == "token" else None
        num_patches = self.grid_size[0] * self.grid_size[1]
        self.use_rope = rope or pos_embed == "rope2d"
        if pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, num_patches, embed_dim))
        elif pos_embed == "sincos2d":  # fixed: a buffer, not saved, recomputed for other grids
            self.register_buffer("pos_embed", sincos_2d_pos_embed(*self.grid_size, embed_dim), persistent=False)
        else:  # rope2d alone: positions enter only through the rotation of q and k
            self.pos_embed = None
        self.pos_drop = nn.Dropout(drop_rate)
        dpr = torch.linspace(0, drop_path_rate, depth).tolist()  # stochastic depth grows with depth
        self.attn_pattern = (attn_pattern, attn_window, attn_dilation, attn_global_tokens)
        self._masks: dict = {}  # (grid, device) -> mask, ("rope", grid, device) -> (cos, sin): once per input size
        self.blocks = nn.ModuleList(
            [
                Block(
                    embed_dim,
                    num_heads,
                    mlp_ratio,
                    qkv_bias,
                    qk_norm,
                    drop_rate,
                    attn_drop_rate,
                    dpr[i],
                    init_values,
                    norm,
                    num_kv_heads,
                    mlp_layer,
                    norm_position,
                    moe_experts,
                    moe_top_k,
                    moe_capacity_factor,
                    kv_latent_dim,
                )
                for i in range(depth)
            ]
        )
        self.norm = nn.Identity() if fc_norm else norm(embed_dim)
        self.fc_norm = norm(embed_dim) if fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self._init_weights()

    def _init_weights(self) -> None:
        # timm's default ('') init: trunc-normal(0.02) for linears and the learned pos embed, tiny class token.
        if isinstance(self.pos_embed, nn.Parameter):
            trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def no_weight_decay(self) -> set[str]:
        """Parameter names that AdamW should not decay (besides norms and biases)."""
        return {"pos_embed", "cls_token"}

    def set_fused_attn(self, enable: bool) -> None:
        """Switch every attention block between the fused SDPA path and the manual path."""
        for m in self.modules():
            if isinstance(m, Attention):
                m.fused_attn = enable

    def pos_embed_for(self, grid: tuple[int, int]) -> torch.Tensor | None:
        """The position embedding for a patch grid, (1, gh * gw, D); resampled when the grid is not the trained one."""
        if self.pos_embed is None:
            return None
        if grid == self.grid_size:
            return self.pos_embed
        if self.pos_embed_type == "sincos2d":
            return sincos_2d_pos_embed(*grid, self.embed_dim).to(self.pos_embed)
        return resample_abs_pos_embed(
            self.pos_embed, new_size=list(grid), old_size=list(self.grid_size), num_prefix_tokens=0
        )

    def rope_for(self, grid: tuple[int, int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of the 2D rotary embedding for a patch grid, built once per grid."""
        key = ("rope", grid, device)
        if key not in self._masks:
            self._masks[key] = tuple(
                t.to(device) for t in rope_2d(grid, self.embed_dim // self.blocks[0].attn.num_heads)
            )
        return self._masks[key]

    def attn_mask_for(self, grid: tuple[int, int], device: torch.device) -> torch.Tensor | None:
        """The (T, T) attention mask of `attn_pattern` for a patch grid (None for global attention)."""
        if self.attn_pattern[0] == "global":
            return None
        key = (grid, device)
        if key not in self._masks:
            self._masks[key] = attention_pattern_mask(grid, *self.attn_pattern, self.num_prefix_tokens).to(device)
        return self._masks[key]

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> tokens (B, prefix + N, D) after the final norm."""
        x, grid = self.patch_embed(x)
        pos = self.pos_embed_for(grid)
        if pos is not None:
            x = x + pos
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.pos_drop(x)
        mask = self.attn_mask_for(grid, x.device)
        rope = self.rope_for(grid, x.device) if self.use_rope else None
        for blk in self.blocks:
            x = blk(x, mask, rope)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Pool the tokens (mean of the patches, or the class token) and classify: (B, T, D) -> (B, num_classes)."""
        x = x[:, self.num_prefix_tokens :].mean(dim=1) if self.global_pool == "avg" else x[:, 0]
        x = self.head_drop(self.fc_norm(x))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_config(**cfg) -> None:
    """Raise ValueError naming the field and value for a configuration that cannot build a model."""
    for name in ("img_size", "patch_size", "in_chans", "embed_dim", "depth", "num_heads"):
        if not isinstance(cfg[name], int) or isinstance(cfg[name], bool) or cfg[name] < 1:
            raise ValueError(f"{name}={cfg[name]!r} must be a positive integer")
    if not isinstance(cfg["num_classes"], int) or isinstance(cfg["num_classes"], bool) or cfg["num_classes"] < 0:
        raise ValueError(f"num_classes={cfg['num_classes']!r} must be an integer >= 0")
    if cfg["img_size"] % cfg["patch_size"]:
        raise ValueError(f"img_size={cfg['img_size']} is not divisible by patch_size={cfg['patch_size']}")
    if cfg["embed_dim"] % cfg["num_heads"]:
        raise ValueError(f"embed_dim={cfg['embed_dim']} is not divisible by num_heads={cfg['num_heads']}")
    if (
        not _is_number(cfg["mlp_ratio"])
        or not 0 < cfg["mlp_ratio"] <= 64
        or int(cfg["embed_dim"] * cfg["mlp_ratio"]) < 1
    ):
        raise ValueError(f"mlp_ratio={cfg['mlp_ratio']!r} must be a number in (0, 64] giving at least one hidden unit")
    params = cfg["depth"] * cfg["embed_dim"] ** 2 * (4 + 2 * cfg["mlp_ratio"])  # attention 4 D^2, MLP 2 r D^2
    if params > 2e10:
        raise ValueError(f"embed_dim={cfg['embed_dim']}, depth={cfg['depth']}: {params:.1e} parameters would not fit")
    if cfg["pos_embed"] not in ("learned", "sincos2d", "rope2d"):
        raise ValueError(f"pos_embed={cfg['pos_embed']!r} is not one of ['learned', 'sincos2d', 'rope2d']")
    if (cfg["rope"] or cfg["pos_embed"] == "rope2d") and (cfg["embed_dim"] // cfg["num_heads"]) % 4:
        raise ValueError(
            f"embed_dim={cfg['embed_dim']} / num_heads={cfg['num_heads']}: 2D RoPE needs a head size divisible by 4"
        )
    if cfg["pos_embed"] == "sincos2d" and cfg["embed_dim"] % 4:
        raise ValueError(f"embed_dim={cfg['embed_dim']} must be divisible by 4 for pos_embed='sincos2d'")
    if cfg["global_pool"] not in ("avg", "token"):
        raise ValueError(f"global_pool={cfg['global_pool']!r} is not one of ['avg', 'token']")
    for name in ("drop_rate", "attn_drop_rate", "drop_path_rate"):
        if not _is_number(cfg[name]) or not 0.0 <= cfg[name] < 1.0:
            raise ValueError(f"{name}={cfg[name]!r} must be in [0, 1)")
    if cfg["init_values"] is not None and (not _is_number(cfg["init_values"]) or not 0 < cfg["init_values"] <= 10):
        raise ValueError(f"init_values={cfg['init_values']!r} must be in (0, 10] (typically 1e-5 to 1), or null")
    kv = cfg["num_kv_heads"]
    if kv is not None and (not isinstance(kv, int) or isinstance(kv, bool) or kv < 1 or cfg["num_heads"] % kv):
        raise ValueError(f"num_kv_heads={kv!r} must be a positive divisor of num_heads={cfg['num_heads']}")
    if cfg["attn_pattern"] not in ("global", "local", "dilated", "sparse"):
        raise ValueError(f"attn_pattern={cfg['attn_pattern']!r} is not one of ['global', 'local', 'dilated', 'sparse']")
    for name in ("attn_window", "attn_dilation"):
        if not isinstance(cfg[name], int) or isinstance(cfg[name], bool) or cfg[name] < 1:
            raise ValueError(f"{name}={cfg[name]!r} must be a positive integer")
    if not isinstance(cfg["attn_global_tokens"], int) or cfg["attn_global_tokens"] < 0:
        raise ValueError(f"attn_global_tokens={cfg['attn_global_tokens']!r} must be an integer >= 0")
    if cfg["mlp_layer"] not in ("mlp", "swiglu"):
        raise ValueError(f"mlp_layer={cfg['mlp_layer']!r} is not one of ['mlp', 'swiglu']")
    if cfg["norm_position"] not in ("pre", "post"):
        raise ValueError(f"norm_position={cfg['norm_position']!r} is not one of ['pre', 'post']")
    E, k = cfg["moe_experts"], cfg["moe_top_k"]
    if not isinstance(E, int) or isinstance(E, bool) or E < 0:
        raise ValueError(f"moe_experts={E!r} must be an integer >= 0 (0: a dense MLP)")
    if E and (not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= E):
        raise ValueError(f"moe_top_k={k!r} must be between 1 and moe_experts={E}")
    if not _is_number(cfg["moe_capacity_factor"]) or cfg["moe_capacity_factor"] < 0:
        raise ValueError(f"moe_capacity_factor={cfg['moe_capacity_factor']!r} must be >= 0 (0: no capacity limit)")
    lat = cfg["kv_latent_dim"]
    if lat is not None and (not isinstance(lat, int) or isinstance(lat, bool) or lat < 1):
        raise ValueError(f"kv_latent_dim={lat!r} must be a positive integer, or null for plain attention")
