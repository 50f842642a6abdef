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

import logging
import os
import sys
import time
import warnings
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from jsonargparse import ArgumentError, set_parsing_settings
from lightning.fabric.utilities.seed import seed_everything
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from vit.commands.command_line import UsageError, moved_field_hint, normalize_args
from vit.data.base import ImageClassificationData
from vit.data.folder import default_memory_budget_gb
from vit.data.listing import write_split
from vit.data.sources import public_class_path
from vit.data.transforms import DataError
from vit.evaluation.after_fit import after_fit_lines
from vit.evaluation.map_callback import AttentionMapCallback
from vit.model.checkpoint import CheckpointError, load_checkpoint
from vit.planning.estimate import RunEstimate
from vit.planning.fine_tune import apply_weights
from vit.planning.plan import FIXED_S
from vit.planning.planned_run import FitBudget, apply_plan, explicit_keys, is_explicit, plan_yaml
from vit.planning.precision import ViTTrainer, apply_precision
from vit.training.callbacks import DataRecord, plain_data_config
from vit.training.checkpoint_io import AtomicCheckpointIO
from vit.training.module import NonFiniteLossError, ViTClassifier
from vit.training.run_folders import checkpoint_folder, newest_last_checkpoint, run_files_folder, version_of
from vit.training.timed_checkpoint import TimedCheckpoint

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
        parser.add_argument(
            "--plan",
            type=bool,
            default=False,
            help="plan the recipe from the data (a folder, CIFAR, torch/NAME or litdata chunks), this machine and "
            "--budget (vit/planning/plan.py); configs/folder.yaml turns it on; any field you set wins over the plan",
        )
        parser.add_argument(
            "--budget",
            type=str | None,
            default=None,
            help="wall time of a planned run from start to exit, e.g. 300s, 5min, 1.5h: the plan picks the model and "
            "the epochs so that the whole learning-rate schedule finishes in it",
        )
        parser.add_argument(
            "--find_label_issues",
            type=bool,
            default=False,
            help="for a folder: write label_issues.csv beside the logs, the training files whose label looks wrong "
            "(the run's training dynamics ranked by cleanlab; vit/evaluation/label_issues.py)",
        )
        parser.add_lightning_class_args(LearningRateMonitor, "lr_monitor")
        parser.set_defaults({"lr_monitor.logging_interval": "step"})
        parser.add_lightning_class_args(AttentionMapCallback, "attention_maps")  # on in every config
        for field, target in LINKED.items():
            parser.link_arguments(f"data.{field}", target, apply_on="instantiate")

    def _parse_ckpt_path(self) -> None:
        # LightningCLI reads the checkpoint's hyper-parameters before anything else: check the file first, so that a
        # missing, truncated or pickle-carrying checkpoint is one line (it is loaded with weights_only=True).
        ckpt = self.config.get("subcommand") and self.config[self.config.subcommand].get("ckpt_path")
        if ckpt and ckpt != "last":
            try:
                load_checkpoint(ckpt)
            except CheckpointError as e:
                raise UsageError(f"error: {e}") from None
        super()._parse_ckpt_path()

    def __init__(self, *args, args_list: Sequence[str] = (), **kwargs):
        self._argv, self._plan = list(args_list), None
        super().__init__(*args, **kwargs)

    def subcommands(self) -> dict[str, set[str]]:
        """Lightning's subcommands without `predict` (main() turns it away), and of those only the one on the command
        line: each subcommand's parser reads the signatures of the Trainer, the model and every data module again,
        0.4 of a smoke fit's 1.6 s for all four. `--help` with no subcommand builds them all, to list them."""
        every = {name: skip for name, skip in LightningCLI.subcommands().items() if name != "predict"}
        chosen = self._argv[0] if self._argv else None
        return {chosen: every[chosen]} if chosen in every else every

    def before_instantiate_classes(self) -> None:
        share_memory_budget(self.config[self.subcommand] if self.subcommand else self.config)
        sub = self.config[self.subcommand] if self.subcommand else self.config
        # Planning happens before anything is built: the folder is then decoded once, at the planned size.
        if self.subcommand == "fit":
            fit = self.config.fit
            if fit.get("ckpt_path"):  # the checkpoint holds the weights; the files may have moved since
                fit.model.init_from = fit.model.stem_from = None
            try:
                # the weights first: their architecture is the model, so the plan is a fine-tune of it
                weights = apply_weights(fit, self._argv)
                self._plan = apply_plan(fit, self._argv, weights=weights)
            except ValueError as e:
                raise UsageError(f"error: {e}") from None
        # after the plan, which measures its own precision: `auto` (the shipped configs') follows this machine
        said = apply_precision(sub, explicit_keys(self._argv, [str(p) for p in (sub.get("config") or [])]))
        if said and rank_zero_only.rank == 0:
            print(said, file=sys.stderr if said.startswith("warning") else sys.stdout, flush=True)

    def _set_seed(self) -> None:
        # Seeded as LightningCLI does, but said after the data is built: a missing dataset is the first line printed.
        key = f"{self.subcommand}.seed_everything" if self.subcommand else "seed_everything"
        seed = self.config.get(key)
        if seed is not False:
            self.config[key] = seed_everything(None if seed is True else seed, workers=True, verbose=False)

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as e:  # our constructors name the field and value: one line, no traceback
            raise UsageError(f"error: {root_cause(e)}") from None

    def instantiate_trainer(self, **kwargs):
        seed = self.config.get(f"{self.subcommand}.seed_everything" if self.subcommand else "seed_everything")
        if seed is not False:
            rank_zero_info(f"Seed set to {seed}")
        return super().instantiate_trainer(plugins=[AtomicCheckpointIO()], **kwargs)

    def _instantiate_trainer(self, config: dict, callbacks: list) -> L.Trainer:
        """Leave out the callbacks whose need a flag turned off, as Lightning leaves out its own: with no logger the
        learning-rate monitor, the attention maps and the saved config.yaml (it would land in the working folder);
        with `enable_checkpointing false` every ModelCheckpoint; with `attention_maps.every_n_epochs 0` the maps."""
        logger = config.get("logger")
        no_logger = logger is False or logger is None or logger == []
        keep = []
        for cb in callbacks:
            if no_logger and isinstance(cb, (LearningRateMonitor, AttentionMapCallback)):
                continue
            if config.get("enable_checkpointing") is False and isinstance(cb, ModelCheckpoint):
                continue
            if isinstance(cb, AttentionMapCallback) and cb.every_n_epochs == 0:
                continue
            keep.append(cb)
        if no_logger:
            self.save_config_callback = None
        return super()._instantiate_trainer(config, keep)

    def before_fit(self) -> None:
        config = self.config[self.subcommand]
        every = config.get("checkpoint_every_n_steps")
        if every is not None and every < 1:
            raise UsageError(f"error: checkpoint_every_n_steps={every} must be >= 1")
        # Mid-epoch checkpoints bound the work a kill can cost: by steps when asked, else by wall time.
        step_ckpt = dict(filename="last-step", monitor=None, save_top_k=1, enable_version_counter=False)
        step_ckpt = (
            ModelCheckpoint(every_n_train_steps=every, **step_ckpt)
            if every
            else TimedCheckpoint(timedelta(minutes=5), **step_ckpt)  # no broadcast per step, unlike Lightning's
        )
        if self.trainer.checkpoint_callbacks:  # none with --trainer.enable_checkpointing false
            self.trainer.callbacks.append(step_ckpt)
            self.trainer.callbacks.append(DataRecord(plain_data_config(config.get("data"))))
        self._resume_in_place(config)
        if self.trainer.strategy.root_device.type == "cuda":
            torch.set_float32_matmul_precision("high")  # TF32 matmuls for fp32 on Ampere and newer
        logger = self.trainer.logger
        folder = checkpoint_folder(self.trainer.default_root_dir, logger)  # a dirpath you gave is kept
        for cb in self.trainer.checkpoint_callbacks:
            if cb.dirpath is None:
                cb.dirpath = str(folder.resolve())
            if cb.monitor == "val/acc" and getattr(self.datamodule, "task", None) == "multilabel":
                cb.monitor = "val/mAP"  # several labels an image: no accuracy; the ranking of each label's scores
        if logger and self.trainer.is_global_zero and getattr(self.datamodule, "samples", None):
            # which file went to which split: the validation split is made here, seeded (the same on resume)
            dm = self.datamodule
            write_split(Path(logger.log_dir, "split.csv"), dm.root, dm.samples, dm.listing)
        if config.get("find_label_issues"):
            from vit.evaluation.label_issues import label_issue_finder

            folder = run_files_folder(logger, self.trainer.checkpoint_callbacks)
            try:
                self.trainer.callbacks.append(label_issue_finder(self.datamodule, folder))
            except ValueError as e:
                raise UsageError(f"error: {e}") from None
        if self._plan is not None:
            self._save_plan_and_keep_budget(logger)
        self.trainer.callbacks.append(RunEstimate())  # say early how long it will take here, and again if that changes
        self._start = time.perf_counter()

    def _save_plan_and_keep_budget(self, logger) -> None:
        plan, deadline = self._plan
        parser, config = self._parser("fit"), self.config.fit
        folder = run_files_folder(logger, self.trainer.checkpoint_callbacks)  # with neither: printed only
        out = Path(folder, "plan.yaml") if folder else None

        def save(max_epochs: int) -> None:
            if self.trainer.is_global_zero and out is not None:
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(plan_yaml(parser, config, max_epochs, plan))

        save(self.trainer.max_epochs)
        if out is not None:
            rank_zero_info(f"plan saved: {out} (vit-train fit --config {out} repeats this run)")
        explicit = explicit_keys(self._argv, [str(p) for p in (config.get("config") or [])])
        if deadline is not None and not is_explicit("trainer.max_epochs", explicit):
            teardown_s = FIXED_S / 2 + plan.after_fit_s  # the passes after fit are inside the budget too
            self.trainer.callbacks.append(FitBudget(deadline, cap=plan.cap, on_change=save, teardown_s=teardown_s))

    def _resume_in_place(self, config) -> None:
        """`--ckpt_path last`: the newest last*.ckpt of this run name; and for a checkpoint of checkpoints/<name>/
        version_<n>/, logs and new checkpoints continue in version_<n>."""
        ckpt, logger = config.get("ckpt_path"), self.trainer.logger
        if not ckpt or logger is None:
            return
        if ckpt == "last":
            found, runs = newest_last_checkpoint(self.trainer.default_root_dir, logger.name)
            if found is None:
                raise UsageError(f"error: --ckpt_path last: no last*.ckpt under {runs}/ to resume from")
            ckpt = str(found)
            self.config_init[self.subcommand]["ckpt_path"] = ckpt
        if (version := version_of(ckpt, logger.name)) is not None:
            logger._version = version  # before anything asks the logger for its folder

    def after_fit(self) -> None:
        if not self.trainer.is_global_zero:
            return
        cbs = self.trainer.checkpoint_callbacks
        cb = next((c for c in cbs if c.monitor), None)
        last = next((c for c in cbs if c.monitor is None and c.filename == "last"), None)
        took = f"after {time.perf_counter() - self._start:.0f} s"
        if cb is not None and cb.best_model_path:
            score = cb.best_model_score
            if score is None:  # ddp_spawn hands the best path back to the launcher, not its score: read it there
                score = load_checkpoint(cb.best_model_path)["callbacks"]
                score = next(v["best_model_score"] for k, v in score.items() if "ModelCheckpoint" in k and v["monitor"])
            print(
                f"\nbest {cb.monitor} {float(score):.4f} {took}\ncheckpoint: {cb.best_model_path}"
                + (f"\nlast:       {last.best_model_path}" if last is not None else "")
            )
        elif (acc := self.trainer.callback_metrics.get("val/acc")) is not None:
            print(f"\nval/acc {float(acc):.4f} (last epoch) {took}; no checkpoint written")
        saved = [c.best_model_path for c in (cb, last) if c is not None and c.best_model_path]
        if not saved:
            return
        tb = next((lg for lg in self.trainer.loggers if isinstance(lg, TensorBoardLogger)), None)
        device, step = self.trainer.strategy.root_device, self.trainer.global_step
        for line in after_fit_lines(saved, self.datamodule, self.model.hparams, device, tb, step):
            print(line)


def local_processes(trainer) -> int:
    """How many training processes this machine will run for a Trainer config (devices: N, a list, "auto", -1)."""
    if os.environ.get("LOCAL_WORLD_SIZE", "").isdigit():  # torchrun
        return int(os.environ["LOCAL_WORLD_SIZE"])
    devices, accelerator = trainer.get("devices", "auto"), str(trainer.get("accelerator", "auto"))
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if str(devices).lstrip("-").isdigit() and int(devices) > 0:
        return int(devices)
    gpus = torch.cuda.device_count() if accelerator in ("auto", "gpu", "cuda") else 0
    return max(1, gpus)  # "auto" and -1: every GPU, or one CPU process


def share_memory_budget(config) -> None:
    """Under DDP every process of a machine decodes and holds its own copy of an in-memory folder: the default
    budget (a quarter of the RAM) is shared among them, unless --data.init_args.max_memory_gb says otherwise."""
    data = config.get("data") or {}
    if (
        public_class_path(data.get("class_path")) != "vit.data.ImageFolderDataModule"
        or data.init_args.get("max_memory_gb") is not None
    ):
        return
    n = local_processes(config.get("trainer") or {})
    if n > 1:
        data.init_args.max_memory_gb = round(default_memory_budget_gb() / n, 2)


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


def main(args: Sequence[str] | None = None) -> ViTCLI:
    """Parse, train (or validate/test), print where the checkpoints are. Errors end in one line: exit 2 for a command
    line, config, data or checkpoint that cannot run (UsageError), 1 for a run that failed (a non-finite loss)."""
    quiet_lightning()
    argv = normalize_args(sys.argv[1:] if args is None else args)
    if argv[0] == "predict":  # Lightning's subcommand needs a predict_step and a predict loader, which we do not have
        raise UsageError(
            "error: vit-train predict is not a command here: classify images with vit-predict --ckpt CKPT IMAGES"
        )
    # `--help` shows each ViTConfig field's meaning: the docstring under its declaration in vit/model/config.py.
    # Reading those means parsing the source of every class on the command line (Trainer's too): 1.8 of the 2.5 s a
    # parse took (cProfile), so only when the help or a commented config is asked for.
    wants_docs = any(a in ("-h", "--help") or (a.startswith("--print_config") and "comments" in a) for a in argv)
    set_parsing_settings(docstring_parse_attribute_docstrings=wants_docs)
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
