"""A Vision Transformer in plain torch.nn: patches, 2D position embeddings, Pre-Norm blocks with QK-Norm, pooling.

No Lightning here: `vit/training/module.py` wraps this model for training. Submodule names follow timm's
`VisionTransformer` (`patch_embed.proj`, `pos_embed`, `blocks.N.attn.qkv`, `attn.q_norm`, `mlp.fc1`, `norm`, `head`)
so that state dicts map onto timm's one to one.

Every architecture field is declared once, in `ViTConfig` below (type, default, meaning, validation); the YAML's
`model.arch` section, checkpoints, timm interop and the recipe planner all read and write that one class.

    model = VisionTransformer(ViTConfig(img_size=32, patch_size=4, num_classes=10, embed_dim=192, depth=6))
    model = VisionTransformer(img_size=32, embed_dim=192)   # the same: keywords are ViTConfig's fields
    logits = model(images)  # (B, 3, 32, 32) -> (B, 10)
"""

import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import DropPath, LayerScale, Mlp, PatchDropout, SwiGLU, resample_abs_pos_embed, trunc_normal_

from vit.model.config import ViTConfig
from vit.model.layers import (
    apply_rope,
    attention_pattern_mask,
    get_norm_layer,
    mimetic_factors,
    rope_2d,
    sincos_2d_pos_embed,
)
from vit.model.moe import MoEMlp
from vit.model.stems import HYBRID_STEMS, CnnStem, conv_stem, resnet_stem, shifted_patches, stem_widths


class PatchEmbed(nn.Module):
    """Image to patch tokens: (B, C, H, W) -> (B, N, D), N = (H/p) * (W/p). One strided convolution (`proj`); with
    `stem='conv'` or `'resnet'` a convolutional or residual stem (`stem`) and a 1x1 convolution (`proj`) to the token
    width; with a timm EfficientNet-Lite name, its first stages to stride p (`stem`, vit/model/stems.py CnnStem) and a
    1x1 convolution; with `stem='spt'` shifted patches, a LayerNorm (`norm`) and a linear layer (`proj`)."""

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int, stem: str = "patch"):
        super().__init__()
        self.patch_size, self.in_chans = patch_size, in_chans
        self.spt = stem == "spt"
        if self.spt:
            self.stem = nn.Identity()
            self.norm = nn.LayerNorm(5 * in_chans * patch_size**2, eps=1e-6)
            self.proj = nn.Linear(5 * in_chans * patch_size**2, embed_dim)
        elif stem in ("conv", "resnet"):
            self.stem = (conv_stem if stem == "conv" else resnet_stem)(in_chans, embed_dim, patch_size)
            self.proj = nn.Conv2d(stem_widths(embed_dim, patch_size)[-1], embed_dim, kernel_size=1)
        elif stem in HYBRID_STEMS:
            self.stem = CnnStem(stem, in_chans, patch_size)
            self.proj = nn.Conv2d(self.stem.out_chans, embed_dim, kernel_size=1)
        else:
            self.stem = nn.Identity()
            self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        H, W = x.shape[-2:]
        if H % self.patch_size or W % self.patch_size:
            raise ValueError(f"input size {H}x{W} is not divisible by patch_size={self.patch_size}")
        if self.spt:
            grid = (H // self.patch_size, W // self.patch_size)
            return self.proj(self.norm(shifted_patches(x, self.patch_size))), grid  # (B, N, D)
        x = self.proj(self.stem(x))  # (B, D, H/p, W/p)
        grid = (x.shape[-2], x.shape[-1])
        return x.flatten(2).transpose(1, 2), grid  # (B, N, D)


class Attention(nn.Module):
    """Multi-head self-attention with QK-Norm; `num_kv_heads` below `num_heads` shares each key/value head across a
    group of query heads (grouped-query attention; 1: multi-query).

    `fused_attn` (per instance) picks `F.scaled_dot_product_attention` (FlashAttention / memory-efficient kernels on
    GPU, the flash kernel on CPU) or the manual `softmax(q k^T / sqrt(d)) v`, which materialises the weights: they pass
    through `attn_drop`, where `vit.evaluation.attention_maps` reads them.

    The variants are subclasses, picked by the config's fields: `Attention(..., kv_latent_dim=r)` builds a
    `LatentAttention`, `lsa=True` a `LocalitySelfAttention` (both: `LatentLocalityAttention`).
    """

    def __new__(cls, *args, kv_latent_dim: int | None = None, lsa: bool = False, **kwargs):
        if cls is Attention:
            cls = {(False, False): Attention, (True, False): LatentAttention, (False, True): LocalitySelfAttention,
                   (True, True): LatentLocalityAttention}[(bool(kv_latent_dim), bool(lsa))]  # fmt: skip
        return super().__new__(cls)

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int,
        qkv_bias: bool = True,
        qk_norm: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] = nn.LayerNorm,
        num_kv_heads: int | None = None,
        kv_latent_dim: int | None = None,
        lsa: bool = False,
    ):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads or num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused_attn = True
        self.projections(dim, qkv_bias, norm_layer, kv_latent_dim)  # lsa: read by __new__ only
        # One norm over head_dim shared by all heads (timm's qk_norm), applied before the dot product.
        self.q_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def projections(self, dim: int, qkv_bias: bool, norm_layer, kv_latent_dim: int | None) -> None:
        """q, then k and v for the kv heads only: [H * Dh | KV * Dh | KV * Dh] (timm's fused qkv when KV == H)."""
        self.qkv = nn.Linear(dim, (self.num_heads + 2 * self.num_kv_heads) * self.head_dim, bias=qkv_bias)

    def qkv_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, H, N, Dh) and k, v (B, KV, N, Dh), q and k normalised."""
        H, KV, Dh = self.num_heads, self.num_kv_heads, self.head_dim
        return self.split_heads(*self.qkv(x).split([H * Dh, KV * Dh, KV * Dh], dim=-1))

    def split_heads(self, q, k, v) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, N, H * Dh) q and (B, N, KV * Dh) k, v -> (B, H, N, Dh), (B, KV, N, Dh) x 2, q and k normalised."""
        B, N, _ = q.shape
        q = q.reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.reshape(B, N, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v.reshape(B, N, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return self.q_norm(q), self.k_norm(k), v

    def scaled_queries(self, q: torch.Tensor) -> tuple[torch.Tensor, float]:
        """q and the factor of q.k: 1 / sqrt(Dh)."""
        return q, self.scale

    @torch.no_grad()
    def mimetic_init_(self, alpha1: float = 0.7, beta1: float = 0.7, alpha2: float = 0.4, beta2: float = 0.4) -> None:
        """Trockman & Kolter (2023)'s values: per head, W_q^h^T W_k^h (D, D) is the best rank-Dh approximation of
        alpha1 Z1 + beta1 I (a query attends to tokens like itself, hence near itself through the position
        embedding); W_proj W_v = alpha2 Z2 - beta2 I over all heads. Biases stay zero. With qk_norm the scale of
        q and k is normalised away and only the directions remain, which carry the structure."""
        D, H, Dh = self.proj.in_features, self.num_heads, self.head_dim
        w = self.qkv.weight  # (3 D, D): rows [q heads | k heads | v]
        for h in range(H):
            left, right = mimetic_factors(D, alpha=alpha1, beta=beta1)
            w[h * Dh : (h + 1) * Dh] = left[:, :Dh].T  # W_q^h (Dh, D)
            w[D + h * Dh : D + (h + 1) * Dh] = right[:Dh]  # W_k^h (Dh, D)
        left, right = mimetic_factors(D, alpha=alpha2, beta=-beta2)
        w[2 * D :] = right  # W_v (D, D)
        self.proj.weight.copy_(left)  # W_proj (D, D): W_proj W_v = alpha2 Z2 - beta2 I

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, rope=None) -> torch.Tensor:
        """x (B, N, D); attn_mask (N, N) bool, True where a query may attend to a key; rope (cos, sin) of the
        patch tokens (prefix tokens such as the class token are not rotated)."""
        B, N, C = x.shape
        q, k, v = self.qkv_heads(x)  # (B, H, N, Dh), (B, KV, N, Dh), (B, KV, N, Dh)
        if rope is not None:  # 2D RoPE: positions enter as rotations of q and k
            q, k = rotate_patch_tokens(q, k, *rope)
        q, scale = self.scaled_queries(q)
        if self.fused_attn:  # enable_gqa: SDPA shares each kv head across its group of query heads without a copy
            x = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, scale=scale, enable_gqa=self.num_kv_heads != self.num_heads,
                dropout_p=self.attn_drop.p if self.training else 0.0,
            )  # fmt: skip
        else:
            x = eager_attention(q, k, v, attn_mask, scale, self.attn_drop)
        x = x.transpose(1, 2).reshape(B, N, C)  # (B, H, N, Dh) -> (B, N, D)
        return self.proj_drop(self.proj(x))


class LatentAttention(Attention):
    """Multi-head latent attention (DeepSeek-V2), non-causal: keys and values are up-projected from one shared
    low-rank latent of each token, c = norm(W_down x) (B, N, kv_latent_dim); q comes from x directly (no decoupled RoPE
    here)."""

    def projections(self, dim: int, qkv_bias: bool, norm_layer, kv_latent_dim: int | None) -> None:
        self.kv_latent_dim = kv_latent_dim
        self.q = nn.Linear(dim, self.num_heads * self.head_dim, bias=qkv_bias)
        self.kv_down = nn.Linear(dim, kv_latent_dim, bias=False)
        self.kv_norm = norm_layer(kv_latent_dim)
        self.kv_up = nn.Linear(kv_latent_dim, 2 * self.num_kv_heads * self.head_dim, bias=qkv_bias)

    def qkv_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        k, v = self.kv_up(self.kv_norm(self.kv_down(x))).chunk(2, dim=-1)  # (B, N, latent) -> 2 x (B, N, KV * Dh)
        return self.split_heads(self.q(x), k, v)


class LocalitySelfAttention(Attention):
    """Locality Self-Attention (Lee et al. 2021): logits q.k / temperature with a learned temperature (from
    sqrt(Dh)); the diagonal mask, so that a token never attends to itself, comes with the block's attn_mask
    (VisionTransformer.attn_mask_for)."""

    def projections(self, dim: int, qkv_bias: bool, norm_layer, kv_latent_dim: int | None) -> None:
        self.temperature = nn.Parameter(torch.tensor(self.head_dim**0.5))
        super().projections(dim, qkv_bias, norm_layer, kv_latent_dim)

    def scaled_queries(self, q: torch.Tensor) -> tuple[torch.Tensor, float]:
        return q / self.temperature, 1.0  # into q: SDPA's scale is a float


class LatentLocalityAttention(LocalitySelfAttention, LatentAttention):
    """LSA's temperature over MLA's projections."""


def rotate_patch_tokens(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple:
    """q (B, H, N, Dh) and k (B, KV, N, Dh) with their last cos.shape[0] tokens (the patches) rotated by 2D RoPE; the
    prefix tokens before them (a class token) are not."""
    p = q.shape[2] - cos.shape[0]
    cos, sin = cos.to(q.dtype), sin.to(q.dtype)  # float32 tables would promote bf16 q, k away from v's dtype
    q = torch.cat([q[:, :, :p], apply_rope(q[:, :, p:], cos, sin)], dim=2)
    k = torch.cat([k[:, :, :p], apply_rope(k[:, :, p:], cos, sin)], dim=2)
    return q, k


def eager_attention(q, k, v, attn_mask: torch.Tensor | None, scale: float, attn_drop: nn.Dropout) -> torch.Tensor:
    """softmax(q k^T scale) v with the weights materialised: they pass through `attn_drop`, where
    vit.evaluation.attention_maps reads them. q (B, H, N, Dh); k, v (B, KV, N, Dh), each shared by H / KV heads."""
    if k.shape[1] != q.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, H, N, Dh)
    attn = (q * scale) @ k.transpose(-2, -1)  # (B, H, N, N)
    if attn_mask is not None:
        attn = attn.masked_fill(~attn_mask, float("-inf"))
    return attn_drop(attn.softmax(dim=-1)) @ v


class Block(nn.Module):
    """Transformer block, Pre-Norm: x + attn(norm1(x)), then x + mlp(norm2(x)), with LayerScale and DropPath.

    Built from the architecture config; `drop_path` is this block's own rate (it grows with depth). A config with
    `norm_position: post` builds a `PostNormBlock` (the same layers, the original Transformer's order)."""

    def __new__(cls, cfg: ViTConfig | None = None, drop_path: float = 0.0):  # no cfg: copy.deepcopy (EMA) rebuilding
        post = cls is Block and cfg is not None and cfg.norm_position == "post"
        return super().__new__(PostNormBlock if post else cls)

    def __init__(self, cfg: ViTConfig, drop_path: float = 0.0):
        super().__init__()
        dim, norm_layer = cfg.embed_dim, get_norm_layer(cfg.norm_layer)
        self.post_norm = cfg.norm_position == "post"
        self.norm1 = norm_layer(dim)
        self.attn = block_attention(cfg)
        self.ls1 = LayerScale(dim, cfg.init_values) if cfg.init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = block_mlp(cfg)
        self.ls2 = LayerScale(dim, cfg.init_values) if cfg.init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, rope=None) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), attn_mask, rope)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class PostNormBlock(Block):
    """Post-Norm (Vaswani et al. 2017): normalise after each residual sum instead of before each branch."""

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, rope=None) -> torch.Tensor:
        x = self.norm1(x + self.drop_path1(self.ls1(self.attn(x, attn_mask, rope))))
        return self.norm2(x + self.drop_path2(self.ls2(self.mlp(x))))


def block_attention(cfg: ViTConfig) -> Attention:
    """A block's attention as the config picks it: heads, QK-Norm, and the variants' fields (GQA/MQA's kv heads, MLA's
    latent width, LSA's learned temperature)."""
    return Attention(
        cfg.embed_dim,
        num_heads=cfg.num_heads,
        qkv_bias=cfg.qkv_bias,
        qk_norm=cfg.qk_norm,
        attn_drop=cfg.attn_drop_rate,
        proj_drop=cfg.drop_rate,
        norm_layer=get_norm_layer(cfg.norm_layer),
        num_kv_heads=cfg.num_kv_heads,
        kv_latent_dim=cfg.kv_latent_dim,
        lsa=cfg.lsa,
    )


def block_mlp(cfg: ViTConfig) -> nn.Module:
    """A block's feed-forward layer as the config picks it: timm's Mlp (GELU) by default; SwiGLU at 2/3 of the hidden
    size (three matrices instead of two: the same parameters); or a mixture of E experts of the dense MLP's size, each
    token paying for top_k of them."""
    dim, hidden = cfg.embed_dim, int(cfg.embed_dim * cfg.mlp_ratio)
    if cfg.moe_experts > 0:
        return MoEMlp(dim, hidden, num_experts=cfg.moe_experts, top_k=cfg.moe_top_k,
                      capacity_factor=cfg.moe_capacity_factor, drop=cfg.drop_rate)  # fmt: skip
    if cfg.mlp_layer == "swiglu":
        return SwiGLU(dim, max(1, round(hidden * 2 / 3)), act_layer=nn.SiLU, drop=cfg.drop_rate)
    return Mlp(dim, hidden, act_layer=nn.GELU, drop=cfg.drop_rate)


class VisionTransformer(nn.Module):
    """ViT classifier built from a `ViTConfig`, or from its fields as keywords (overriding `cfg`'s)."""

    def __init__(self, cfg: ViTConfig | None = None, **fields):
        super().__init__()
        unknown = sorted(set(fields) - set(ViTConfig.fields()))
        if unknown:
            raise ValueError(f"unknown architecture field(s) {unknown}; known: {list(ViTConfig.fields())}")
        cfg = dataclasses.replace(cfg or ViTConfig(), **fields)  # validated again by __post_init__
        self.cfg = cfg
        self.num_classes = cfg.num_classes
        self.embed_dim = cfg.embed_dim
        self.global_pool = cfg.global_pool
        self.grid_size = (cfg.img_size // cfg.patch_size, cfg.img_size // cfg.patch_size)
        # Tokens before the patches: the class token (token pooling), then DeiT's distillation token
        self.num_prefix_tokens = int(cfg.global_pool == "token") + int(cfg.dist_token)
        self.pos_embed_type = cfg.pos_embed
        norm = get_norm_layer(cfg.norm_layer)

        self.patch_embed = PatchEmbed(cfg.patch_size, cfg.in_chans, cfg.embed_dim, cfg.stem)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.embed_dim)) if cfg.global_pool == "token" else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, cfg.embed_dim)) if cfg.dist_token else None
        num_patches = self.grid_size[0] * self.grid_size[1]
        self.use_rope = cfg.rope or cfg.pos_embed == "rope2d"
        if cfg.pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, num_patches, cfg.embed_dim))
        elif cfg.pos_embed == "sincos2d":  # fixed: a buffer, not saved, recomputed for other grids
            pe = sincos_2d_pos_embed(*self.grid_size, cfg.embed_dim)
            self.register_buffer("pos_embed", pe, persistent=False)
        else:  # rope2d alone: positions enter only through the rotation of q and k
            self.pos_embed = None
        self.pos_drop = nn.Dropout(cfg.drop_rate)
        # (B, prefix + N, D) -> (B, prefix + keep, D) in training only; prefix tokens are always kept
        self.patch_drop = (
            PatchDropout(cfg.patch_drop_rate, num_prefix_tokens=self.num_prefix_tokens) if cfg.patch_drop_rate else None
        )
        dpr = torch.linspace(0, cfg.drop_path_rate, cfg.depth).tolist()  # stochastic depth grows with depth
        self.attn_pattern = (cfg.attn_pattern, cfg.attn_window, cfg.attn_dilation, cfg.attn_global_tokens)
        # The trained grid's attention mask and RoPE tables as buffers (not saved: they follow from the config), so
        # that .to() moves them; another grid's are computed when it comes
        self.register_buffer("attn_mask", self.pattern_mask(self.grid_size), persistent=False)
        cos, sin = rope_2d(self.grid_size, cfg.embed_dim // cfg.num_heads) if self.use_rope else (None, None)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.blocks = nn.ModuleList([Block(cfg, drop_path=dpr[i]) for i in range(cfg.depth)])
        self.norm = nn.Identity() if cfg.fc_norm else norm(cfg.embed_dim)
        self.fc_norm = norm(cfg.embed_dim) if cfg.fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.head = nn.Linear(cfg.embed_dim, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        if cfg.dist_token:  # the distillation token's own head (timm's name)
            self.head_dist = nn.Linear(cfg.embed_dim, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        self._init_weights()

    def _init_weights(self) -> None:
        # timm's default ('') init: trunc-normal(0.02) for linears, the learned pos embed and the distillation token
        # (timm's VisionTransformerDistilled), tiny class token.
        if isinstance(self.pos_embed, nn.Parameter):
            trunc_normal_(self.pos_embed, std=0.02)
        if self.dist_token is not None:
            trunc_normal_(self.dist_token, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        if self.cfg.weight_init == "mimetic":
            for blk in self.blocks:
                blk.attn.mimetic_init_()

    def no_weight_decay(self) -> set[str]:
        """Parameter names that AdamW should not decay (besides norms and biases)."""
        return {"pos_embed", "cls_token", "dist_token"}

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
        """cos, sin (N, Dh / 2) of the 2D rotary embedding for a patch grid: the buffers for the trained one."""
        if grid == self.grid_size:
            return self.rope_cos, self.rope_sin
        return tuple(t.to(device) for t in rope_2d(grid, self.cfg.embed_dim // self.cfg.num_heads))

    def pattern_mask(self, grid: tuple[int, int]) -> torch.Tensor | None:
        """The (T, T) bool mask of `attn_pattern` over a grid's tokens, without the diagonal under LSA (a token never
        attends to itself); None for global attention."""
        if self.attn_pattern[0] == "global":
            return None
        mask = attention_pattern_mask(grid, *self.attn_pattern, self.num_prefix_tokens)
        return mask & ~torch.eye(mask.shape[0], dtype=torch.bool) if self.cfg.lsa else mask

    def attn_mask_for(self, grid: tuple[int, int], device: torch.device, tokens: int) -> torch.Tensor | None:
        """The (T, T) attention mask for a patch grid (None for global attention without LSA). Global attention under
        LSA needs only the token count: the `tokens` that PatchDropout kept are no longer the grid, and a token still
        must not attend to itself."""
        if self.attn_pattern[0] == "global":
            return ~torch.eye(tokens, dtype=torch.bool, device=device) if self.cfg.lsa else None
        return self.attn_mask if grid == self.grid_size else self.pattern_mask(grid).to(device)

    def forward_features(self, x: torch.Tensor, taps: list | None = None) -> torch.Tensor:
        """(B, C, H, W) -> tokens (B, prefix + N, D) after the final norm; `taps` (a list): each block's output tokens
        (B, prefix + N, D), before the final norm, are appended to it (the unknown-image scores read them)."""
        x, grid = self.patch_embed(x)
        pos = self.pos_embed_for(grid)
        if pos is not None:
            x = x + pos
        prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.dist_token) if t is not None]
        if prefix:  # (B, N, D) -> (B, prefix + N, D)
            x = torch.cat([*prefix, x], dim=1)
        x = self.pos_drop(x)
        if self.patch_drop is not None:
            x = self.patch_drop(x)
        mask = self.attn_mask_for(grid, x.device, x.shape[1])
        rope = self.rope_for(grid, x.device) if self.use_rope else None
        for blk in self.blocks:
            x = blk(x, mask, rope)
            if taps is not None:
                taps.append(x)
        return self.norm(x)

    def forward_heads(self, x: torch.Tensor, pre_logits: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The class head's logits (B, num_classes), from the mean of the patch tokens or the class token of the
        tokens (B, T, D), and the distillation token's head's (None without one); their inputs (B, D) if pre_logits."""
        pooled = x[:, self.num_prefix_tokens :].mean(dim=1) if self.global_pool == "avg" else x[:, 0]
        pooled = self.head_drop(self.fc_norm(pooled))
        if self.dist_token is None:
            return (pooled if pre_logits else self.head(pooled)), None
        dist = self.head_drop(self.fc_norm(x[:, self.num_prefix_tokens - 1]))
        return (pooled, dist) if pre_logits else (self.head(pooled), self.head_dist(dist))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Pool the tokens and classify: (B, T, D) -> (B, num_classes); with a distillation token the mean of the two
        heads' logits (DeiT's answer). pre_logits: what the class head reads (B, D)."""
        logits, dist = self.forward_heads(x, pre_logits)
        return logits if dist is None or pre_logits else (logits + dist) / 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))
