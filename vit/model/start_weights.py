"""A new run's starting weights, of both kinds: a ViT's (`--model.init_from`, vit/model/pretrained.py) and a hybrid
stem's ImageNet ones (`--model.stem_from`, vit/model/cnn_weights.py), read once; a checkpoint then holds them."""

from vit.model.cnn_weights import load_stem, read_cnn_weights
from vit.model.pretrained import find_pretrained, load_pretrained
from vit.model.vision_transformer import VisionTransformer

WEIGHT_SOURCES = ("init_from", "stem_from")  # hyper-parameters that name files read once, for a new run


def load_start_weights(model: VisionTransformer, init_from: str | None, stem_from: str | None, class_names=None):
    """A new run's weights: a ViT's (`init_from`, load_pretrained) and a hybrid stem's ImageNet ones (`stem_from`,
    vit/model/cnn_weights.py). A checkpoint keeps them in its state dict: see forget_weight_files."""
    if init_from:
        load_pretrained(model, find_pretrained(init_from, model.cfg.num_heads), class_names)
    if stem_from:
        load_stem(model, read_cnn_weights(stem_from))


def forget_weight_files(checkpoint: dict) -> None:
    """The weights are in the state dict: reloading must not read the original files (they may have moved). Each
    source moves from the hyper-parameters to the checkpoint's top level, where it is kept for the record."""
    for key in WEIGHT_SOURCES:
        hp = checkpoint.get("hyper_parameters")
        if isinstance(hp, dict) and hp.get(key):
            checkpoint[key] = str(hp[key])
            checkpoint["hyper_parameters"] = {**hp, key: None}
