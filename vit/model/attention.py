"""Self-attention: the plain multi-head attention with QK-Norm and grouped kv heads, its variants (MLA's latent
keys and values, LSA's learned temperature), and `build_attention(cfg)`, the one place that picks among them.

    attn = build_attention(ViTConfig(embed_dim=192, num_heads=3))   # an Attention
    y = attn(x)  # (B, N, 192) -> (B, N, 192)
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from vit.model.config import ViTConfig
from vit.model.layers import apply_rope, get_norm_layer, mimetic_factors


class Attention(nn.Module):
    """Multi-head self-attention with QK-Norm; `num_kv_heads` below `num_heads` shares each key/value head across a
    group of query heads (grouped-query attention; 1: multi-query).

    `fused_attn` (per instance) picks `F.scaled_dot_product_attention` (FlashAttention / memory-efficient kernels on
    GPU, the flash kernel on CPU) or the manual `softmax(q k^T / sqrt(d)) v`, which materialises the weights: they pass
    through `attn_drop`, where `vit.evaluation.attention_maps` reads them.

    The variants below are subclasses that replace `projections` (how q, k, v are made) or `scaled_queries` (how q.k
    is scaled); `build_attention(cfg)` at the end of this file picks one from the config.
    """

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
    ):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads or num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused_attn = True
        self.projections(dim, qkv_bias, norm_layer)
        # One norm over head_dim shared by all heads (timm's qk_norm), applied before the dot product.
        self.q_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def projections(self, dim: int, qkv_bias: bool, norm_layer) -> None:
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
                q,
                k,
                v,
                attn_mask=attn_mask,
                scale=scale,
                enable_gqa=self.num_kv_heads != self.num_heads,
                dropout_p=self.attn_drop.p if self.training else 0.0,
            )
        else:
            x = eager_attention(q, k, v, attn_mask, scale, self.attn_drop)
        x = x.transpose(1, 2).reshape(B, N, C)  # (B, H, N, Dh) -> (B, N, D)
        return self.proj_drop(self.proj(x))


class LatentAttention(Attention):
    """Multi-head latent attention (DeepSeek-V2), non-causal: keys and values are up-projected from one shared
    low-rank latent of each token, c = norm(W_down x) (B, N, kv_latent_dim); q comes from x directly (no decoupled RoPE
    here)."""

    def __init__(self, dim: int, *, kv_latent_dim: int, **kwargs):
        self.kv_latent_dim = kv_latent_dim  # read by projections(), which Attention.__init__ calls
        super().__init__(dim, **kwargs)

    def projections(self, dim: int, qkv_bias: bool, norm_layer) -> None:
        kv_latent_dim = self.kv_latent_dim
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

    def projections(self, dim: int, qkv_bias: bool, norm_layer) -> None:
        self.temperature = nn.Parameter(torch.tensor(self.head_dim**0.5))
        super().projections(dim, qkv_bias, norm_layer)

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


# (MLA's latent width set, LSA on) -> the class; a variant's own fields are its constructor's keywords
ATTENTION_CLASSES = {
    (False, False): Attention,
    (True, False): LatentAttention,
    (False, True): LocalitySelfAttention,
    (True, True): LatentLocalityAttention,
}


def build_attention(cfg: ViTConfig) -> Attention:
    """A block's attention as the config picks it: heads, QK-Norm, GQA/MQA's kv heads, and the variant's class
    (ATTENTION_CLASSES) with its own fields."""
    cls = ATTENTION_CLASSES[(bool(cfg.kv_latent_dim), bool(cfg.lsa))]
    own = {"kv_latent_dim": cfg.kv_latent_dim} if cfg.kv_latent_dim else {}
    return cls(
        cfg.embed_dim,
        num_heads=cfg.num_heads,
        qkv_bias=cfg.qkv_bias,
        qk_norm=cfg.qk_norm,
        attn_drop=cfg.attn_drop_rate,
        proj_drop=cfg.drop_rate,
        norm_layer=get_norm_layer(cfg.norm_layer),
        num_kv_heads=cfg.num_kv_heads,
        **own,
    )
