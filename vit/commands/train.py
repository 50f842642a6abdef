"""The training command, `vit-train` (or `python train.py`): LightningCLI with this toolkit's defaults.

    vit-train                                   # fit configs/cifar10.yaml (CIFAR-10 from data/, downloaded if it can)
    vit-train --config configs/digits.yaml      # `fit` is the default subcommand
    vit-train fit --data.root path/to/images --budget 10min   # a folder: the recipe is planned (vit/planning/plan.py)
    vit-train --budget 30min                    # CIFAR-10 too: a recipe planned for 30 minutes on this machine
    vit-train validate --config configs/digits.yaml --ckpt_path checkpoints/digits/version_0/last.ckpt

A `--config configs/NAME.yaml` that does not exist where you run it is taken from the configs shipped with the package,
so the commands above work from any folder. Checkpoints go to checkpoints/<run>/version_<n>/ (best by val/acc, last.ckpt
every epoch, last-step.ckpt every `--checkpoint_every_n_steps` steps or else every 5 minutes, all written atomically),
TensorBoard logs to logs/<run>/version_<n>/. Resuming (`--ckpt_path last`) continues in the same folders.
"""

import sys
import time
import warnings
from collections.abc import Sequence

import lightning as L
from jsonargparse import ArgumentError
from lightning.fabric.utilities.seed import seed_everything
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_info

from vit.commands.command_line import UsageError, moved_field_hint, root_cause, train_argv
from vit.data.base import ImageClassificationData
from vit.data.transforms import DataError
from vit.evaluation.map_callback import AttentionMapCallback
from vit.model.checkpoint import CheckpointError
from vit.run import steps as fit_steps
from vit.run.planned import add_plan_arguments
from vit.run.trainer import ViTTrainer
from vit.training.checkpoint_io import AtomicCheckpointIO
from vit.training.module import NonFiniteLossError, ViTClassifier
from vit.training.run import add_run_arguments, callbacks_to_keep

# Facts about the data that the model must agree with: taken from the DataModule, never typed twice.
LINKED = {
    "num_classes": "model.arch.num_classes",
    "img_size": "model.arch.img_size",
    "in_chans": "model.arch.in_chans",
    "class_names": "model.class_names",
    "task": "model.task",
    "mean": "model.mean",
    "std": "model.std",
}


class ViTCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        add_run_arguments(parser)  # checkpoints, last.ckpt, last-step.ckpt, label issues, the learning-rate monitor
        add_plan_arguments(parser)  # --plan, --budget
        parser.add_lightning_class_args(AttentionMapCallback, "attention_maps")  # on in every config
        for field, target in LINKED.items():
            parser.link_arguments(f"data.{field}", target, apply_on="instantiate")

    def parse_arguments(self, parser, args) -> None:
        super().parse_arguments(parser, args)
        sub = self.config[self.config.subcommand] if self.config.get("subcommand") else self.config
        try:  # before LightningCLI reads the checkpoint's hyper-parameters: a bad file is one line
            fit_steps.check_ckpt_path(sub.get("ckpt_path"))
        except CheckpointError as e:
            raise UsageError(f"error: {e}") from None
        # Seeded in before_instantiate_classes, as LightningCLI would, and said after the data is built (a missing
        # dataset is the first line printed): Lightning's own seeding, which says it at once, is handed False.
        self._seed, sub["seed_everything"] = sub.get("seed_everything"), False

    def __init__(self, *args, args_list: Sequence[str] = (), **kwargs):
        self._argv, self._prepared = list(args_list), fit_steps.Prepared()
        super().__init__(*args, **kwargs)

    def subcommands(self) -> dict[str, set[str]]:
        """Lightning's subcommands without `predict` (main() turns it away), and of those only the one on the command
        line: each subcommand's parser reads the signatures of the Trainer, the model and every data module again,
        0.4 of a smoke fit's 1.6 s for all four. `--help` with no subcommand builds them all, to list them."""
        every = {name: skip for name, skip in LightningCLI.subcommands().items() if name != "predict"}
        chosen = self._argv[0] if self._argv else None
        return {chosen: every[chosen]} if chosen in every else every

    def before_instantiate_classes(self) -> None:
        sub = self.config[self.subcommand] if self.subcommand else self.config
        if self._seed is not False:  # the seed goes back into the config the run saves (config.yaml, plan.yaml)
            self._seed = seed_everything(None if self._seed is True else self._seed, workers=True, verbose=False)
        sub["seed_everything"] = self._seed
        try:  # memory share, pretrained weights, the plan (before anything is built), precision
            self._prepared = fit_steps.before_build(sub, self.subcommand, self._argv)
        except ValueError as e:
            raise UsageError(f"error: {e}") from None

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as e:  # our constructors name the field and value: one line, no traceback
            raise UsageError(f"error: {root_cause(e)}") from None

    def instantiate_trainer(self, **kwargs):
        fit_steps.say_precision(self._prepared)  # after the data is built: a missing dataset is the first line printed
        if self._seed is not False:
            rank_zero_info(f"Seed set to {self._seed}")
        return super().instantiate_trainer(plugins=[AtomicCheckpointIO()], **kwargs)

    def _instantiate_trainer(self, config: dict, callbacks: list) -> L.Trainer:
        # Private: LightningCLI has no public hook between the callbacks' instantiation and the Trainer's, and the
        # Trainer refuses a ModelCheckpoint beside enable_checkpointing=False. tests/test_commands.py
        # test_the_private_lightning_api_we_override_is_still_there fails when Lightning changes it.
        keep, no_logger = callbacks_to_keep(config, callbacks, needs_logger=(AttentionMapCallback,))
        if no_logger:  # the saved config.yaml would land in the working folder
            self.save_config_callback = None
        return super()._instantiate_trainer(config, keep)

    def before_fit(self) -> None:
        config, parser = self.config[self.subcommand], self._parser("fit")
        try:  # resume in place, checkpoint folders, split.csv, label issues, plan and budget
            ckpt = fit_steps.before_fit(
                self.trainer, self.datamodule, config, prepared=self._prepared, argv=self._argv, parser=parser
            )
        except ValueError as e:
            raise UsageError(f"error: {e}") from None
        if ckpt is not None:
            self.config_init[self.subcommand]["ckpt_path"] = ckpt
        self._start = time.perf_counter()

    def after_fit(self) -> None:
        if self.trainer.is_global_zero:  # the best checkpoint, then calibration, `unknown`, the test split
            for line in fit_steps.after_fit(self.trainer, self.datamodule, self.model.hparams, self._start):
                print(line)


def main(args: Sequence[str] | None = None) -> ViTCLI:
    """Parse, train (or validate/test), print where the checkpoints are. Errors end in one line: exit 2 for a command
    line, config, data or checkpoint that cannot run (UsageError), 1 for a run that failed (a non-finite loss)."""
    argv = train_argv(sys.argv[1:] if args is None else args)
    # We hand LightningCLI the rewritten sys.argv on purpose; its warning about args beside sys.argv is noise here.
    warnings.filterwarnings("ignore", message=".*args parameter is intended to run from within Python.*")
    try:
        return ViTCLI(
            ViTClassifier,
            ImageClassificationData,
            trainer_class=ViTTrainer,  # precision: auto
            subclass_mode_data=True,
            args=argv,
            args_list=argv,
            save_config_kwargs={"overwrite": True},
            # raise instead of printing the whole usage: main() prints one line naming the key and the value
            parser_kwargs={"exit_on_error": False},
            trainer_defaults={
                "logger": {
                    "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                    "init_args": {"save_dir": "logs", "name": "vit"},
                }
            },
        )
    except NonFiniteLossError as e:  # training ran and failed: exit 1
        sys.exit(f"error: {e}")
    except (DataError, CheckpointError) as e:
        raise UsageError(f"error: {e}") from None
    except ArgumentError as e:  # jsonargparse: wrong type, unknown key, bad YAML
        msg = " ".join(str(e).split())
        raise UsageError(f"error: {msg}{moved_field_hint(msg)} (vit-train fit --help lists the options)") from None


def run() -> int:
    """The `vit-train` console script: exit status 0 after a successful run (errors exit 1 with one line)."""
    main()
    return 0


if __name__ == "__main__":
    sys.exit(run())
