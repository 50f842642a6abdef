"""The commands name one concept one way: each checkpoint flag is `--ckpt` and also answers to vit-train's
`--ckpt_path`; each output flag is `--out` and also answers to `--output`."""

import pytest

from vit.commands import attention, eval, export, predict, serve

PARSERS = {
    "vit-predict": predict.build_parser,
    "vit-export": export.build_parser,
    "vit-eval": eval.build_parser,
    "vit-serve": serve.build_parser,
    "vit-attention": attention.build_parser,
    "vit-attention faithfulness": attention.build_faithfulness_parser,
}
REQUIRED = {  # the other arguments each parser needs, so that only the flag under test varies
    "vit-predict": ["img.png"],
    "vit-export": ["--format", "onnx", "--out", "m.onnx"],
    "vit-eval": ["folder", "--out", "report"],
    "vit-serve": [],
    "vit-attention": ["--out", "maps", "img.png"],
    "vit-attention faithfulness": ["folder"],
}


@pytest.mark.parametrize("name", PARSERS)
@pytest.mark.parametrize("flag", ["--ckpt", "--ckpt_path"])
def test_every_checkpoint_flag_answers_to_both_names(name, flag):
    args = PARSERS[name]().parse_args([flag, "model.ckpt", *REQUIRED[name]])
    assert args.ckpt == "model.ckpt"


OUTPUT = {  # the other arguments, without an output flag
    "vit-predict": ["img.png"],
    "vit-export": ["--format", "onnx"],
    "vit-eval": ["folder"],
    "vit-attention": ["img.png"],
}


@pytest.mark.parametrize("name", OUTPUT)
@pytest.mark.parametrize("flag", ["--out", "--output"])
def test_every_output_flag_answers_to_both_names(name, flag):
    args = PARSERS[name]().parse_args(["--ckpt", "m.ckpt", flag, "target", *OUTPUT[name]])
    assert (args.output if name == "vit-predict" else args.out) == "target"


def test_the_private_lightning_api_we_override_is_still_there(tmp_path):
    """vit/commands/train.py overrides LightningCLI._instantiate_trainer and vit/training/run.py sets a built
    TensorBoardLogger's _version: no public API does either. A Lightning that renames or reshapes them fails here."""
    import inspect

    from lightning.pytorch.cli import LightningCLI
    from lightning.pytorch.loggers import TensorBoardLogger

    assert list(inspect.signature(LightningCLI._instantiate_trainer).parameters) == ["self", "config", "callbacks"]
    assert "self._instantiate_trainer(" in inspect.getsource(LightningCLI.instantiate_trainer)
    logger = TensorBoardLogger(tmp_path, name="run")
    logger._version = 3
    assert logger.version == 3 and logger.log_dir == str(tmp_path / "run" / "version_3")
    # the public hooks used instead of the rest: parse_arguments before the checkpoint's hyper-parameters are read
    init = inspect.getsource(LightningCLI.__init__)
    assert init.index("self.parse_arguments(") < init.index("self._parse_ckpt_path()") < init.index("self._set_seed()")
    assert init.index("self._set_seed()") < init.index("self.before_instantiate_classes()")
