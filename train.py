"""Train a Vision Transformer with LightningCLI.

    python train.py fit --config configs/digits.yaml            # offline, ~45 s on a 2-core CPU
    python train.py fit --config configs/cifar10.yaml --trainer.max_epochs 5
    python train.py fit --config configs/folder.yaml --data.root path/to/images
    python train.py fit --config configs/digits.yaml --print_config
    python train.py fit --config configs/digits.yaml --ckpt_path last   # resume the newest run of this config

Checkpoints go to checkpoints/<run>/version_<n>/ (best by val/acc, last.ckpt every epoch, last-step.ckpt every
`--checkpoint_every_n_steps` steps or else every 5 minutes, all written atomically), TensorBoard logs to
logs/<run>/version_<n>/. Resuming continues in the same folders.
"""

import re
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
from jsonargparse import ArgumentError
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

from vit.callbacks import AttentionMapCallback
from vit.checkpoint import CheckpointError, load_checkpoint
from vit.checkpoint_io import AtomicCheckpointIO
from vit.data import DataError, ImageClassificationData
from vit.module import NonFiniteLossError, ViTClassifier

# Facts about the data that the model must agree with: taken from the DataModule, never typed twice.
LINKED = ("num_classes", "img_size", "in_chans", "class_names", "mean", "std")


class ViTCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults(
            {
                "checkpoint.monitor": "val/acc",
                "checkpoint.mode": "max",
                "checkpoint.save_last": False,  # see last_checkpoint
                # No "val/acc" inside the name: the slash would make a sub-folder.
                "checkpoint.filename": "best-epoch{epoch:03d}",
                "checkpoint.auto_insert_metric_name": False,
            }
        )
        # Lightning 2.6 writes `save_last` only when the monitored checkpoint was saved in the same step, so a
        # `last.ckpt` would lag behind whenever val/acc did not improve. A second callback with no monitor keeps
        # exactly one checkpoint, the latest, every epoch.
        parser.add_lightning_class_args(ModelCheckpoint, "last_checkpoint")
        parser.set_defaults(
            {
                "last_checkpoint.filename": "last",
                "last_checkpoint.monitor": None,
                "last_checkpoint.save_top_k": 1,
                "last_checkpoint.enable_version_counter": False,
            }
        )
        parser.add_argument(
            "--checkpoint_every_n_steps",
            type=int | None,
            default=None,
            help="also write last-step.ckpt every N training steps (default: every 5 minutes of training)",
        )
        parser.add_lightning_class_args(LearningRateMonitor, "lr_monitor")
        parser.set_defaults({"lr_monitor.logging_interval": "step"})
        parser.add_lightning_class_args(AttentionMapCallback, "attention_maps")  # on in every config
        for field in LINKED:
            parser.link_arguments(f"data.{field}", f"model.{field}", apply_on="instantiate")

    def _parse_ckpt_path(self) -> None:
        # LightningCLI reads the checkpoint's hyper-parameters before anything else: check the file first, so that a
        # missing, truncated or pickle-carrying checkpoint is one line (it is loaded with weights_only=True).
        ckpt = self.config.get("subcommand") and self.config[self.config.subcommand].get("ckpt_path")
        if ckpt and ckpt != "last":
            try:
                load_checkpoint(ckpt)
            except CheckpointError as e:
                sys.exit(f"error: {e}")
        super()._parse_ckpt_path()

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as e:  # our constructors name the field and value: one line, no traceback
            sys.exit(f"error: {root_cause(e)}")

    def instantiate_trainer(self, **kwargs):
        return super().instantiate_trainer(plugins=[AtomicCheckpointIO()], **kwargs)

    def before_fit(self) -> None:
        config = self.config[self.subcommand]
        every = config.get("checkpoint_every_n_steps")
        if every is not None and every < 1:
            sys.exit(f"error: checkpoint_every_n_steps={every} must be >= 1")
        # Mid-epoch checkpoints bound the work a kill can cost: by steps when asked, else by wall time.
        step_ckpt = ModelCheckpoint(
            filename="last-step",
            monitor=None,
            save_top_k=1,
            enable_version_counter=False,
            every_n_train_steps=every,
            train_time_interval=None if every else timedelta(minutes=5),
        )
        self.trainer.callbacks.append(step_ckpt)
        self._resume_in_place(config)
        if self.trainer.strategy.root_device.type == "cuda":
            torch.set_float32_matmul_precision("high")  # TF32 matmuls for fp32 on Ampere and newer
        logger = self.trainer.logger
        run = f"{logger.name}/version_{logger.version}" if logger else "default"

        for cb in self.trainer.checkpoint_callbacks:
            cb.dirpath = str(Path("checkpoints", run).resolve())
        self._start = time.perf_counter()

    def _resume_in_place(self, config) -> None:
        """`--ckpt_path last`: the newest last*.ckpt of this run name; and for a checkpoint of checkpoints/<name>/
        version_<n>/, logs and new checkpoints continue in version_<n>."""
        ckpt, logger = config.get("ckpt_path"), self.trainer.logger
        if not ckpt or logger is None:
            return
        if ckpt == "last":
            found = sorted(
                Path("checkpoints", logger.name).glob("version_*/last*.ckpt"), key=lambda p: p.stat().st_mtime
            )
            if not found:
                sys.exit(f"error: --ckpt_path last: no last*.ckpt under checkpoints/{logger.name}/ to resume from")
            ckpt = str(found[-1])
            self.config_init[self.subcommand]["ckpt_path"] = ckpt
        match = re.fullmatch(r"version_(\d+)", Path(ckpt).parent.name)
        if match and Path(ckpt).parent.parent.name == logger.name:
            logger._version = int(match.group(1))  # before anything asks the logger for its folder

    def after_fit(self) -> None:
        cbs = self.trainer.checkpoint_callbacks
        cb, last = next(c for c in cbs if c.monitor), next(c for c in cbs if c.monitor is None)
        if self.trainer.is_global_zero and cb.best_model_path:
            print(
                f"\nbest val/acc {float(cb.best_model_score):.4f} after {time.perf_counter() - self._start:.0f} s"
                f"\ncheckpoint: {cb.best_model_path}\nlast:       {last.best_model_path}"
            )


def root_cause(e: BaseException) -> BaseException:
    """The innermost ValueError of a chain: jsonargparse wraps ours in a multi-line Union report."""
    inner = e
    while (nxt := inner.__cause__ or inner.__context__) is not None and isinstance(nxt, ValueError):
        inner = nxt
    return inner


def main(args=None) -> ViTCLI:
    try:
        return ViTCLI(
            ViTClassifier,
            ImageClassificationData,
            subclass_mode_data=True,
            args=args,
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
    except (DataError, CheckpointError, NonFiniteLossError) as e:
        sys.exit(f"error: {e}")
    except ArgumentError as e:  # jsonargparse: wrong type, unknown key, bad YAML
        sys.exit(f"error: {' '.join(str(e).split())} (train.py fit --help lists the options)")


def exit_without_teardown() -> None:
    """Exit 0 now, skipping the interpreter's teardown of torch and its libraries: 1.5 s on a 2-core CPU (3% of
    `make train`), measured as `import train` then a normal exit against os._exit. Safe only after a successful run:
    Lightning has finalized the loggers, checkpoints were written atomically and fsynced; so only when no child
    process (DataLoader workers) is left to shut down. Errors leave main() through sys.exit and never get here."""
    import logging
    import multiprocessing
    import os

    if multiprocessing.active_children():
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    exit_without_teardown()
