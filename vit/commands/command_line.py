"""How the commands read their command lines: the flags the `vit-*` commands share, spelled once (`model_flags`,
`device_flag`); and `vit-train`'s, timm-style: no subcommand means `fit`, `fit` without a config trains the product's
main job (or your folder), config paths name the packaged configs, and a field that moved is named."""

import argparse
import logging
import re
import sys
from collections.abc import Sequence
from pathlib import Path

SUBCOMMANDS = ("fit", "validate", "test", "predict")
CKPT_HELP = (
    "checkpoint written by train.py (loaded as data, never as code), or a run's folder or name (checkpoints/folder, "
    "folder): its newest version's best checkpoint"
)


def checkpoint_arg(text: str) -> str:
    """--ckpt's value: a file as given; a run's folder or name resolved to its newest best checkpoint, said on stderr
    (vit/model/checkpoint.py deployable_checkpoint)."""
    from vit.model.checkpoint import deployable_checkpoint

    path = str(deployable_checkpoint(text))
    if path != text:
        print(f"checkpoint: {path}", file=sys.stderr)
    return path


def model_flags(ap: argparse.ArgumentParser, onnx_help: str | None = None) -> None:
    """`--ckpt` (alias `--ckpt_path`, Lightning's name), required; with `onnx_help`, `--onnx FILE` instead of it."""
    if onnx_help is None:
        ap.add_argument("--ckpt", "--ckpt_path", dest="ckpt", required=True, type=checkpoint_arg, help=CKPT_HELP)
        return
    model = ap.add_mutually_exclusive_group(required=True)
    model.add_argument("--ckpt", "--ckpt_path", dest="ckpt", type=checkpoint_arg, help=CKPT_HELP)
    model.add_argument("--onnx", metavar="FILE", help=onnx_help)


class UsageError(SystemExit):
    """A command line that cannot run as given (a flag, a config field, a data or checkpoint path): exit status 2, as
    argparse's and the other `vit-*` commands' usage errors; its one line ("error: ...") is printed on stderr when
    raised and is the exception's str. A failure while running (a non-finite loss) stays exit 1."""

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message
        print(message, file=sys.stderr, flush=True)

    def __str__(self) -> str:
        return self.message


def device_flag(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: CUDA when available")


DEFAULT_CONFIG = "configs/cifar10.yaml"  # the product's main job
FOLDER_CONFIG = "configs/folder.yaml"  # `--data.root PATH` without a config: your own images


def packaged_config(path: str) -> Path:
    """`path` if it exists, else the config of that name shipped with the package (`configs/X.yaml` -> the wheel's
    `vit/configs/X.yaml`, or the repository's `configs/` for a source checkout)."""
    p = Path(path)
    if p.exists():
        return p
    rel = Path(*p.parts[1:]) if p.parts and p.parts[0] == "configs" else p
    package = Path(__file__).resolve().parent.parent  # vit/
    for root in (package / "configs", package.parent / "configs"):
        if (root / rel).is_file():
            return root / rel
    return p  # jsonargparse reports the missing file


def normalize_args(argv: Sequence[str]) -> list[str]:
    """timm-style command lines for LightningCLI: no subcommand means `fit`; `fit` without a config trains
    configs/cifar10.yaml (configs/folder.yaml when `--data.root` is given); config paths resolve as packaged_config."""
    argv = list(argv)
    if argv and argv[0] in ("-h", "--help"):
        return argv
    sub, rest = (argv[0], argv[1:]) if argv and argv[0] in SUBCOMMANDS else ("fit", argv)
    has_config = any(a == "--config" or a.startswith("--config=") for a in rest)
    if sub == "fit" and not has_config:
        data_root = any(a.split("=")[0] in ("--data.root", "--data.init_args.root") for a in rest)
        rest = ["--config", FOLDER_CONFIG if data_root else DEFAULT_CONFIG, *rest]
    out = []
    for i, a in enumerate(rest):
        if a.startswith("--config="):
            a = f"--config={packaged_config(a.split('=', 1)[1])}"
        elif i > 0 and rest[i - 1] == "--config":
            a = str(packaged_config(a))
        out.append(a)
    return [sub, *out]


def train_argv(args: Sequence[str]) -> list[str]:
    """vit-train's command line made ready for LightningCLI: Lightning's tips quiet, normalize_args, `predict` turned
    away (Lightning's subcommand needs a predict_step and a predict loader, which we do not have), and the classes'
    source read for their docstrings only where they are shown."""
    quiet_lightning()
    argv = normalize_args(args)
    if argv[0] == "predict":
        raise UsageError(
            "error: vit-train predict is not a command here: classify images with vit-predict --ckpt CKPT IMAGES"
        )
    # `--help` shows each ViTConfig field's meaning: the docstring under its declaration in vit/model/config.py.
    # Reading those means parsing the source of every class on the command line (Trainer's too): 1.8 of the 2.5 s a
    # parse took (cProfile), so only when the help or a commented config is asked for.
    from jsonargparse import set_parsing_settings

    wants_docs = any(a in ("-h", "--help") or (a.startswith("--print_config") and "comments" in a) for a in argv)
    set_parsing_settings(docstring_parse_attribute_docstrings=wants_docs)
    return argv


def moved_field_hint(message: str) -> str:
    """Old configs had the architecture flat under `model:`; name the new place of such a key."""
    from vit.model.config import ViTConfig

    for key in re.findall(r"\b(?:model\.)?(\w+)", message):
        if key in ViTConfig.fields() and f"arch.{key}" not in message:
            return f" (architecture fields moved: model.{key} is now model.arch.{key})"
    return ""


def root_cause(e: BaseException) -> BaseException:
    """The innermost ValueError of a chain: jsonargparse wraps ours in a multi-line Union report."""
    inner = e
    while (nxt := inner.__cause__ or inner.__context__) is not None and isinstance(nxt, ValueError):
        inner = nxt
    return inner


def quiet_lightning() -> None:
    """Lightning's start-up advertisements ("💡 Tip: ... litlogger / litmodels") are not ours to print."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(getattr(f, "__name__", "") == "_no_tips" for f in logger.filters):
            logger.addFilter(_no_tips)


def _no_tips(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("💡")
