"""A Vision Transformer in plain torch.nn: patches, 2D position embeddings, Pre-Norm blocks with QK-Norm, pooling.

No Lightning here: `vit/training/module.py` wraps this model for training. Submodule names follow timm's
`VisionTransformer` (`patch_embed.proj`, `pos_embed`, `blocks.N.attn.qkv`, `attn.q_norm`, `mlp.fc1`, `norm`, `head`)
so that state dicts map onto timm's one to one.

Every architecture field is declared once, in `ViTConfig` (vit/model/config.py: type, default, meaning, validation);
the YAML's `model.arch` section, checkpoints, timm interop and the recipe planner all read and write that one class.
The variants are classes of their own, each picked from the config in one factory: `build_patch_embed`
(vit/model/patch_embed.py), `build_attention` (vit/model/attention.py), `build_block` and `build_mlp` (below).

    model = VisionTransformer(ViTConfig(img_size=32, patch_size=4, num_classes=10, embed_dim=192, depth=6))
    model = VisionTransformer(img_size=32, embed_dim=192)   # the same: keywords are ViTConfig's fields
    logits = model(images)  # (B, 3, 32, 32) -> (B, 10)
"""

import dataclasses

import torch
import torch.nn as nn
from timm.layers import DropPath, LayerScale, Mlp, PatchDropout, SwiGLU, resample_abs_pos_embed, trunc_normal_

from vit.model.attention import Attention, build_attention
from vit.model.config import ViTConfig
from vit.model.layers import attention_pattern_mask, get_norm_layer, rope_2d, sincos_2d_pos_embed
from vit.model.moe import MoEMlp
from vit.model.patch_embed import PatchEmbed, build_patch_embed, patch_grid
from vit.model.stems import shifted_patches

# the layers, importable from here too (vit/model/attention.py and patch_embed.py define them)
__all__ = [
    "Attention",
    "Block",
    "PatchEmbed",
    "PostNormBlock",
    "VisionTransformer",
    "build_block",
    "build_mlp",
    "patch_grid",
    "shifted_patches",
]


class Block(nn.Module):
    """Transformer block, Pre-Norm: x + attn(norm1(x)), then x + mlp(norm2(x)), with LayerScale and DropPath.

    Built from the architecture config (its attention and MLP by build_attention and build_mlp); `drop_path` is this
    block's own rate (it grows with depth). `build_block` picks it or `PostNormBlock` from `cfg.norm_position`."""

    def __init__(self, cfg: ViTConfig, drop_path: float = 0.0):
        super().__init__()
        dim, norm_layer = cfg.embed_dim, get_norm_layer(cfg.norm_layer)
        self.post_norm = cfg.norm_position == "post"
        self.norm1 = norm_layer(dim)
        self.attn = build_attention(cfg)
        self.ls1 = LayerScale(dim, cfg.init_values) if cfg.init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = build_mlp(cfg)
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


def build_block(cfg: ViTConfig, drop_path: float = 0.0) -> Block:
    """The block `cfg.norm_position` names: Pre-Norm (`Block`) or Post-Norm (`PostNormBlock`), the same layers."""
    return (PostNormBlock if cfg.norm_position == "post" else Block)(cfg, drop_path)


def build_mlp(cfg: ViTConfig) -> nn.Module:
    """A block's feed-forward layer as the config picks it: timm's Mlp (GELU) by default; SwiGLU at 2/3 of the hidden
    size (three matrices instead of two: the same parameters); or a mixture of E experts of the dense MLP's size, each
    token paying for top_k of them."""
    dim, hidden = cfg.embed_dim, int(cfg.embed_dim * cfg.mlp_ratio)
    if cfg.moe_experts > 0:
        return MoEMlp(
            dim,
            hidden,
            num_experts=cfg.moe_experts,
            top_k=cfg.moe_top_k,
            capacity_factor=cfg.moe_capacity_factor,
            drop=cfg.drop_rate,
        )
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
        self.grid_size = patch_grid(cfg.img_size, cfg.patch_size)
        # Tokens before the patches: the class token (token pooling), then DeiT's distillation token
        self.num_prefix_tokens = int(cfg.global_pool == "token") + int(cfg.dist_token)
        self.pos_embed_type = cfg.pos_embed
        norm = get_norm_layer(cfg.norm_layer)

        self.patch_embed = build_patch_embed(cfg)
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
        self.blocks = nn.ModuleList([build_block(cfg, drop_path=dpr[i]) for i in range(cfg.depth)])
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
