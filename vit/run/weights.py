"""`--model.init_from`: the architecture and the normalisation come from the weights, not from the config.

A timm user names weights (`--model.init_from vit_small_patch16_224.augreg_in21k_ft_in1k`, a file, or a checkpoint of
this toolkit) and expects the model they hold: `apply_weights` reads them (vit/model/pretrained.py) and writes into
the `fit` config, before the plan, wherever you did not set the key yourself:
- every architecture field the weights fix (width, depth, heads, MLP ratio, biases, qk_norm, pooling, LayerScale, the
  patch size), and for timm weights the plain ViT they come from (patchify stem, learned position embedding, Pre-Norm,
  LayerNorm, a dense GELU MLP, global attention);
- the weights' own resolution and their mean and std, for a DataModule that takes them (your own folder does), as
  timm's train.py does: pretrained features expect the inputs they were trained on (read from the weights' config,
  or timm's registry).
A field you set that the weights contradict stops the run with one line naming both values. Image size, channels
and classes come from the data (position embeddings resampled, first layer adapted, a new head); a patch size you
set is resampled (FlexiViT). It runs before the plan, which then plans a fine-tune of this model (the resolution,
learning rate, layer decay and epochs: vit/planning/fine_tune_plan.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning.pytorch.utilities import rank_zero_info

from vit.model.cnn_weights import WHEELS, CnnWeights, CnnWeightsError, is_cnn_source, read_cnn_weights
from vit.model.pretrained import FREE, Pretrained, find_pretrained
from vit.model.stems import HYBRID_STEMS
from vit.planning.explicit import explicit_keys, is_explicit

# What timm's VisionTransformer is, in our fields: set with timm weights unless you set them.
TIMM_PLAIN = dict(
    stem="patch",
    pos_embed="learned",
    norm_layer="layernorm",
    norm_position="pre",
    mlp_layer="mlp",
    moe_experts=0,
    attn_pattern="global",
    rope=False,
    num_kv_heads=None,
    kv_latent_dim=None,
)
LINKED_FROM_DATA = ("img_size", "in_chans", "num_classes")


def apply_weights(config, argv: Sequence[str]) -> Pretrained | CnnWeights | None:
    """Fill `config` (jsonargparse Namespace of `fit`) from `model.init_from`; None without it. Raises ValueError
    (InteropError, CheckpointError) with one line."""
    source = config.model.get("init_from")
    if not source:
        return None
    explicit = explicit_keys(argv, [str(p) for p in (config.get("config") or [])])
    if is_cnn_source(source):
        return apply_cnn_weights(config, source, explicit)
    heads = config.model.arch.num_heads if is_explicit("model.arch.num_heads", explicit) else None
    weights = find_pretrained(source, heads)
    # a distillation token is the run's choice (it needs a teacher), never the weights': DeiT's distilled weights
    # fine-tune without one unless --model.arch.dist_token says otherwise
    kept = FREE if weights.toolkit else (*LINKED_FROM_DATA, "dist_token")
    wanted = {k: v for k, v in weights.arch.items() if k not in kept}
    if weights.toolkit:
        wanted["patch_size"] = weights.arch["patch_size"]
    else:
        wanted = {**TIMM_PLAIN, **wanted}
    for field, value in wanted.items():
        key = f"model.arch.{field}"
        if not is_explicit(key, explicit):
            config[key] = value
        elif field == "patch_size" and not weights.toolkit:
            continue  # resampled (FlexiViT)
        elif config.get(key) != value and field not in TIMM_PLAIN:
            raise ValueError(f"--{key} {config.get(key)} contradicts the weights' {value} (init_from={source})")
    said = []
    init_args = config.data.get("init_args") or {}
    if "img_size" in init_args and not is_explicit("data.init_args.img_size", explicit):
        config.data.init_args.img_size = weights.arch["img_size"]  # the weights' own resolution, as timm's train.py
        said.append(f"{weights.arch['img_size']} px")
    if weights.mean and "mean" in init_args and not is_explicit("data.init_args.mean", explicit):
        config.data.init_args.mean, config.data.init_args.std = tuple(weights.mean), tuple(weights.std)
        said.append(f"mean {list(weights.mean)}, std {list(weights.std)}")
    a = weights.arch
    rank_zero_info(
        f"init_from {source} ({weights.path}): {a['embed_dim']} wide x {a['depth']} blocks, {a['num_heads']} heads, "
        f"patch {config.model.arch.patch_size}, {a['global_pool']} pooling" + "".join(f", {s}" for s in said)
    )
    return weights


def apply_cnn_weights(config, source: str, explicit: set[str]) -> CnnWeights:
    """`--model.init_from` naming a CNN's ImageNet weights (vit/model/cnn_weights.py): the hybrid (its stages as the
    patch embedding: `model.arch.stem` the CNN, `model.stem_from` the weights, patch 16) with the weights' mean and
    std, wherever you did not set the key; the blocks start from their initialisation."""
    from vit.planning.hybrid_plan import HYBRID_PATCH

    weights = read_cnn_weights(source)
    if weights.arch not in HYBRID_STEMS:
        raise CnnWeightsError(
            f"init_from={source}: {weights.arch} weights; the hybrid's stem takes {', '.join(HYBRID_STEMS)} (the "
            f"wheels {', '.join(WHEELS)}, their files, or timm's files of those models)"
        )
    config.model.init_from = None  # ViT weights: none; the stem's are loaded from stem_from
    if is_explicit("model.arch.stem", explicit) and config.model.arch.stem != weights.arch:
        raise ValueError(
            f"--model.arch.stem {config.model.arch.stem} contradicts the weights' {weights.arch} (init_from={source})"
        )
    config.model.arch.stem, config.model.stem_from = weights.arch, source
    if not is_explicit("model.arch.patch_size", explicit):
        config.model.arch.patch_size = HYBRID_PATCH
    init_args = config.data.get("init_args") or {}
    if "mean" in init_args and not is_explicit("data.init_args.mean", explicit):
        config.data.init_args.mean, config.data.init_args.std = weights.mean, weights.std
    rank_zero_info(
        f"init_from {source}: {weights.arch}'s ImageNet stages to stride {config.model.arch.patch_size} as the patch "
        f"embedding (the hybrid), mean {list(weights.mean)}, std {list(weights.std)}"
    )
    return weights
