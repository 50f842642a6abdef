"""Weights to start from: a timm name, a weights file or a checkpoint of this toolkit, with what they say about
themselves (the architecture, the head count, the normalisation), loaded into a model built for new data.

    weights = find_pretrained("vit_small_patch16_224.augreg_in21k_ft_in1k")  # from the local Hugging Face cache
    weights = find_pretrained("model.safetensors")   # timm's config.json beside it is read when it is there
    weights.arch, weights.mean, weights.std          # ViTConfig fields the weights fix; their normalisation
    load_pretrained(model, weights)                  # a new head, position embeddings and patch kernel resampled

The head count is the one thing a state dict does not show (every shape matches with 3 heads of 64 or 2 of 96, and
the logits differ): it comes from config.json's `model_args`, from timm's registry for the architecture it names, or
from the qk_norm weights (their size is the head size); otherwise the caller must say it. Nothing here downloads
unless a timm name is missing from the cache and `HF_HUB_OFFLINE` is not set (then huggingface_hub fetches it, as
timm's own `pretrained=True` does).
"""

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from vit.model.checkpoint import CheckpointError, arch_from_hparams, load_checkpoint
from vit.model.patch_embed import patch_grid
from vit.model.record import given_preprocessing
from vit.model.timm_state import InteropError, config_from_state_dict, convert_from_timm, load_state_dict
from vit.model.vision_transformer import VisionTransformer
from vit.model.weight_names import hub_name, names_a_file

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # what timm's Hugging Face repos hold, in timm's order


@dataclass
class Pretrained:
    """Weights and what they fix. `arch`: ViTConfig fields (for a toolkit checkpoint, all of them); `mean`, `std`:
    the normalisation they were trained with (None: unknown); `state_dict`: timm's keys, or ours for a checkpoint."""

    source: str
    path: Path
    state_dict: dict[str, torch.Tensor]
    arch: dict
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    toolkit: bool = False
    class_names: list[str] | None = None  # what the head's outputs mean, where the weights say (label_names)


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment now (huggingface_hub reads it once, at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "huggingface"
    return Path(home) / "hub"


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def timm_name(source: str) -> tuple[str, str] | None:
    """(architecture, Hugging Face repo id) of a timm name such as vit_small_patch16_224.augreg_in21k_ft_in1k or
    hf-hub:timm/NAME; None when timm does not know it."""
    import timm
    from timm.models import get_pretrained_cfg, split_model_name_tag

    name = hub_name(source)
    arch, _ = split_model_name_tag(name)
    if "/" in name or not timm.is_model(arch):
        return None
    cfg = get_pretrained_cfg(name) if "." in name else get_pretrained_cfg(arch)
    return arch, (cfg.hf_hub_id if cfg is not None and cfg.hf_hub_id else f"timm/{name}")


def from_cache(source: str, repo: str) -> Path:
    """The weights file of a Hugging Face repo in the local cache (downloaded first when online)."""
    cache = hf_cache_dir()
    folder = cache / f"models--{repo.replace('/', '--')}"
    for snapshot in sorted((folder / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime, reverse=True):
        for name in WEIGHT_FILES:
            if (snapshot / name).is_file():
                return snapshot / name
    hint = (
        f"{source}: not in the Hugging Face cache: put model.safetensors of https://huggingface.co/{repo} (and its "
        f"config.json) in {folder}/snapshots/main/"
    )
    if _offline():
        raise InteropError(hint + " (HF_HUB_OFFLINE is set: nothing is downloaded)")
    try:
        from huggingface_hub import hf_hub_download

        path = Path(hf_hub_download(repo, WEIGHT_FILES[0], cache_dir=cache))
        try:
            hf_hub_download(repo, "config.json", cache_dir=cache)
        except Exception:  # the weights alone will do: timm's name says the rest
            pass
        return path
    except Exception as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InteropError(f"{hint}; the download failed: {reason}") from None


def _known_to_timm(arch: str) -> bool:
    import timm

    return timm.is_model(arch)


def _timm_facts(arch: str, model_args: dict) -> tuple[int, tuple, tuple]:
    """Head count and normalisation of a timm architecture, from timm's registry (built on the meta device: no
    memory, no weights)."""
    import timm

    with torch.device("meta"):
        model = timm.create_model(arch, pretrained=False, **model_args)
    blocks = getattr(model, "blocks", None)
    if not blocks or not hasattr(blocks[0], "attn"):
        raise InteropError(f"{arch}: not a timm VisionTransformer; only ViTs start this model")
    cfg = model.pretrained_cfg or {}
    return blocks[0].attn.num_heads, tuple(cfg.get("mean", ())) or None, tuple(cfg.get("std", ())) or None


def find_pretrained(source: str | Path, num_heads: int | None = None) -> Pretrained:
    """Resolve and read weights to start from. `num_heads`: what the caller knows (a config); weights that say
    otherwise stop here. Raises InteropError (or CheckpointError) with one line naming the source."""
    text = str(source)
    path = Path(text).expanduser()
    arch_name, model_args, mean, std, labels = None, {}, None, None, None
    if path.is_dir():
        found = [path / n for n in WEIGHT_FILES if (path / n).is_file()]
        if not found:
            raise InteropError(f"init_from={text}: a folder without {' or '.join(WEIGHT_FILES)}")
        path = found[0]
    elif not path.exists():
        named = None if names_a_file(text) or text.startswith((".", "/", "~")) else timm_name(text)
        if named is None:
            raise InteropError(f"init_from={text}: no such weights file, and not a timm model name")
        arch_name, repo = named
        path = from_cache(text, repo)
    if path.suffix == ".ckpt":
        return _from_toolkit_checkpoint(text, path, num_heads)

    meta = path.parent / "config.json"  # timm's Hugging Face layout: the architecture and pretrained_cfg beside
    if meta.is_file():
        try:
            info = json.loads(meta.read_text())
        except (OSError, ValueError) as e:
            raise InteropError(f"{meta}: not readable JSON ({e})") from None
        arch_name = info.get("architecture") or arch_name
        model_args = info.get("model_args") or {}
        pcfg = info.get("pretrained_cfg") or {}
        mean, std = pcfg.get("mean"), pcfg.get("std")
        labels = info.get("label_names")
    sd = _read_once(path, load_state_dict)
    heads = model_args.get("num_heads")
    if arch_name is not None and (heads is None or mean is None) and _known_to_timm(arch_name):
        timm_heads, timm_mean, timm_std = _timm_facts(arch_name, model_args)
        heads = heads or timm_heads
        mean, std = mean or timm_mean, std or timm_std
    q_norm = sd.get("blocks.0.attn.q_norm.weight")
    if heads is None and q_norm is not None:
        heads = sd["patch_embed.proj.weight"].shape[0] // q_norm.shape[0]
    if heads is not None and num_heads is not None and heads != num_heads:
        raise InteropError(
            f"init_from={text}: the weights have {heads} attention heads, the config num_heads={num_heads}"
        )
    heads = heads or num_heads
    if heads is None:
        raise InteropError(
            f"init_from={text}: the weights do not say how many attention heads they have (no config.json beside "
            "them naming a timm architecture, no qk_norm): give --model.arch.num_heads"
        )
    arch = config_from_state_dict(sd, heads)
    mean, std = tuple(map(float, mean)) if mean else None, tuple(map(float, std)) if std else None
    return Pretrained(text, path, sd, arch, mean, std, class_names=list(labels) if labels else None)


# The last file read, kept until the model takes its weights: `vit-train fit` reads the weights to set the
# architecture before anything is built, then the module reads them again to load them (a ViT-B file: 350 MB twice).
_last_read: tuple[tuple, object] | None = None


def _read_once(path: Path, reader):
    global _last_read
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size, reader)
    if _last_read is None or _last_read[0] != key:
        _last_read = (key, reader(path))
    return _last_read[1]


def _from_toolkit_checkpoint(text: str, path: Path, num_heads: int | None) -> Pretrained:
    try:
        ckpt = _read_once(path, load_checkpoint)
    except CheckpointError as e:
        raise InteropError(f"init_from={e}") from None
    arch = arch_from_hparams(ckpt["hyper_parameters"]).to_dict()
    if num_heads is not None and num_heads != arch["num_heads"]:
        raise InteropError(f"init_from={text}: the checkpoint has {arch['num_heads']} heads, the config {num_heads}")
    sd = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    mean, std, names = given_preprocessing(ckpt)
    return Pretrained(text, path, sd, arch, mean, std, toolkit=True, class_names=names)


def load_pretrained(model: VisionTransformer, weights: Pretrained, class_names: list[str] | None = None) -> None:
    """Weights into a model built from their architecture for new data: a new head when the classes differ (in
    number, or by name where both the weights and `class_names` name them: 5 clothing classes are not 5 others),
    position embeddings resampled to the model's grid, the patch kernel to its patch size (FlexiViT), and the first
    layer adapted when the channels differ (timm's adapt_input_conv: grey images from RGB weights and back)."""
    from timm.models import adapt_input_conv

    cfg, src = model.cfg, weights.source
    names = [k for k in weights.arch if k not in FREE] if weights.toolkit else FIXED_BY_WEIGHTS
    fixed = [k for k in names if k in weights.arch and weights.arch[k] != getattr(cfg, k)]
    if fixed:
        diffs = "; ".join(f"{k} {weights.arch[k]} in the weights, {getattr(cfg, k)} in the config" for k in fixed)
        raise InteropError(f"init_from={src}: the model's architecture differs: {diffs}")
    if not weights.toolkit and cfg.stem != "patch":
        raise InteropError(f"init_from={src}: timm's ViT weights have a patchify layer, this model stem={cfg.stem!r}")
    sd = dict(weights.state_dict)
    if weights.toolkit:
        sd = _resample_ours(sd, model, weights.arch)
    else:
        sd = convert_from_timm(
            sd, weights.arch, img_size=model.grid_size[0] * cfg.patch_size, patch_size=cfg.patch_size
        )
    kernel = "patch_embed.proj.weight" if cfg.stem == "patch" else "patch_embed.stem.0.weight"
    if kernel in sd and sd[kernel].ndim == 4 and sd[kernel].shape[1] != cfg.in_chans:
        sd[kernel] = adapt_input_conv(cfg.in_chans, sd[kernel])  # (D, C, p, p): channels summed or repeated
    elif cfg.in_chans != weights.arch["in_chans"]:
        raise InteropError(f"init_from={src}: {weights.arch['in_chans']} input channels, the data {cfg.in_chans}")
    renamed = bool(class_names and weights.class_names) and list(class_names) != list(weights.class_names)
    heads = ("head", "head_dist")
    if weights.arch["num_classes"] != cfg.num_classes or renamed:
        sd = {k: v for k, v in sd.items() if k.split(".")[0] not in heads}
    if not cfg.dist_token:  # a distilled model's class head and blocks go on without its distillation token
        sd = {k: v for k, v in sd.items() if k.split(".")[0] not in ("dist_token", "head_dist")}
    if model.pos_embed_type != "learned":
        sd.pop("pos_embed", None)  # fixed sincos: nothing to load
    missing, unexpected = model.load_state_dict(sd, strict=False)
    global _last_read
    _last_read = None  # the model holds its copy now
    # New parameters: LSA's temperatures start from timm's own scale, sqrt(head_dim); a distillation token and its
    # head the weights lack start as a new model's
    missing = [k for k in missing if not k.endswith(".attn.temperature") and k.split(".")[0] != "dist_token"]
    if {k for k in missing if k.split(".")[0] not in heads} or unexpected:
        raise InteropError(
            f"init_from={src}: weights do not fit: missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )


# The fields whose values timm weights' shapes (or their config) fix; image size, patch size, channels and classes
# may differ (resampled, adapted, a new head; a distillation token added or left out). A toolkit checkpoint fixes every
# field but FREE.
FIXED_BY_WEIGHTS = ("embed_dim", "depth", "num_heads", "mlp_ratio", "qkv_bias", "qk_norm", "global_pool", "fc_norm")
FREE = (
    "img_size",
    "patch_size",
    "in_chans",
    "num_classes",
    "drop_rate",
    "attn_drop_rate",
    "drop_path_rate",
    "patch_drop_rate",
    "weight_init",
    "dist_token",
)


def _resample_ours(sd: dict, model: VisionTransformer, arch: dict) -> dict:
    """A toolkit checkpoint's weights at another image size: the learned position embedding resampled."""
    from timm.layers import resample_abs_pos_embed

    pe = sd.get("pos_embed")
    old = patch_grid(arch["img_size"], arch["patch_size"])
    if isinstance(pe, torch.Tensor) and old != model.grid_size:
        sd["pos_embed"] = resample_abs_pos_embed(pe, list(model.grid_size), list(old), num_prefix_tokens=0)
    if arch["patch_size"] != model.cfg.patch_size:
        raise InteropError(
            f"init_from: the checkpoint's patch_size={arch['patch_size']}, the config's {model.cfg.patch_size}: "
            "keep the checkpoint's"
        )
    return sd
