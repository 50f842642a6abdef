"""The training recipe: ViTClassifier refuses bad arguments at construction, in one line naming the field and the
value; its fields stay flat `--model.<field>` flags and flat checkpoint hyper-parameters."""

import pytest

import train
from vit.model.config import ViTConfig
from vit.training.module import ViTClassifier
from vit.training.recipe import RECIPE_FIELDS, TrainingRecipe


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
        ({"guidance_weight": 0.5}, "guidance_weight=0.5 imitates a teacher's features: set --model.teacher"),
        ({"learning_rate": 0.1}, "model argument 'learning_rate' is neither a training recipe field nor arch"),
    ],
)
def test_bad_arguments_are_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ViTClassifier(arch=ViTConfig(img_size=32, patch_size=4, embed_dim=16, depth=1, num_heads=2), **kwargs)


def test_good_arguments_build():
    module = ViTClassifier(arch=ViTConfig(embed_dim=16, depth=1, num_heads=2), lr=0.0, ema_decay=0.0, layer_decay=1.0)
    assert module.hparams.lr == 0.0 and module.hparams.arch["embed_dim"] == 16


def test_the_module_takes_two_config_objects_and_keeps_the_recipe_typed():
    import inspect

    assert list(inspect.signature(ViTClassifier.__init__).parameters) == ["self", "arch", "recipe"]
    module = ViTClassifier(arch=ViTConfig(embed_dim=16, depth=1, num_heads=2), lr=0.002, mean=(0.1, 0.2, 0.3))
    assert module.recipe == TrainingRecipe(lr=0.002, mean=(0.1, 0.2, 0.3))
    # every field in the checkpoint's hyper-parameters, defaults included, as plain types (weights_only loads)
    assert set(module.hparams) == RECIPE_FIELDS | {"arch"}
    assert module.hparams.mean == [0.1, 0.2, 0.3] and module.hparams.betas == [0.9, 0.999]
    # a checkpoint's hyper-parameters build the same module back
    again = ViTClassifier(**module.hparams)
    assert again.recipe == module.recipe and again.hparams == module.hparams


def test_every_recipe_field_is_a_flat_model_flag(capsys):
    """jsonargparse follows `**recipe` to TrainingRecipe: each field is `--model.<field>` with its type and help. A
    jsonargparse that stopped resolving it would print no such keys."""
    import yaml

    with pytest.raises(SystemExit) as e:
        train.main(["fit", "--model.lr", "0.02", "--model.schedule", "wsd", "--print_config"])
    assert e.value.code == 0
    model = yaml.safe_load(capsys.readouterr().out)["model"]
    from vit.commands.train import LINKED

    linked = {target.removeprefix("model.") for target in LINKED.values()}  # set from the DataModule, not flags
    assert set(model) - {"arch"} == RECIPE_FIELDS - linked and {"mean", "class_names"} <= linked
    assert model["lr"] == 0.02 and model["schedule"] == "wsd" and model["ema_decay"] == 0.0
    with pytest.raises(SystemExit):
        train.main(["fit", "--model.schedule", "step", "--print_config"])
    assert "schedule" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        train.main(["fit", "--help"])
    assert "--model.ema_decay" in capsys.readouterr().out and e.value.code == 0
