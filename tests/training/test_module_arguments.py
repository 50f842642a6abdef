"""ViTClassifier refuses bad arguments at construction, in one line naming the field and the value."""

import pytest

from vit.model.config import ViTConfig
from vit.training.module import ViTClassifier


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"lr": -1e-3}, "lr=-0.001 must be >= 0"),
        ({"logit_adjust_tau": -1}, "logit_adjust_tau=-1 must be >= 0"),
        ({"label_smoothing": 1.5}, r"label_smoothing=1.5 must be in \[0, 1\]"),
        ({"patch_drop_until": -0.1}, r"patch_drop_until=-0.1 must be in \[0, 1\]"),
        ({"ema_decay": 1.0}, r"ema_decay=1.0 must be in \[0, 1\)"),
        ({"layer_decay": 0.0}, r"layer_decay=0.0 must be in \(0, 1\]"),
        ({"freeze_backbone_epochs": -1}, "freeze_backbone_epochs=-1 must be >= 0"),
        ({"freeze_stem_epochs": -1}, "freeze_stem_epochs=-1 must be >= 0"),
        ({"freeze_stem_epochs": 1}, "freeze_stem_epochs=1 holds a pretrained CNN stem still, but stem='patch'"),
        ({"schedule": "step"}, "schedule='step' must be 'cosine' or 'wsd'"),
        ({"resize_from": 6}, "resize_from=6 must be a multiple of patch_size=4 below img_size=32"),
        ({"class_names": ["a", "b"]}, "class_names has 2 names but num_classes=10"),
    ],
)
def test_bad_arguments_are_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ViTClassifier(arch=ViTConfig(img_size=32, patch_size=4, embed_dim=16, depth=1, num_heads=2), **kwargs)


def test_good_arguments_build():
    module = ViTClassifier(arch=ViTConfig(embed_dim=16, depth=1, num_heads=2), lr=0.0, ema_decay=0.0, layer_decay=1.0)
    assert module.hparams.lr == 0.0 and module.hparams.arch["embed_dim"] == 16
