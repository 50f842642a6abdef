"""A training run's steps around Lightning's fit, in the order `vit-train` calls them: the memory budget shared among a
machine's processes, the callbacks a run's flags leave out, resuming in place, the checkpoints' folders and the
mid-epoch checkpoint, the split.csv of a folder, and the lines that say where the best checkpoint went.

vit/run/steps.py calls these in order, with the plan and its budget (vit/run/planned.py) and the
reports after fit (vit/evaluation/after_fit.py), which live with the packages they need (a package imports only from
lower ones).
"""

import os
import time
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

from vit.data.folder import default_memory_budget_gb
from vit.data.sources import public_class_path
from vit.data.val_split import write_split
from vit.model.checkpoint import load_checkpoint
from vit.training.callbacks import DataRecord, plain_data_config
from vit.training.run_folders import checkpoint_folder, newest_last_checkpoint, version_of
from vit.training.timed_checkpoint import TimedCheckpoint

STEP_CHECKPOINT_EVERY = timedelta(minutes=5)  # without --checkpoint_every_n_steps


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


def add_run_arguments(parser) -> None:
    """vit-train's options for the run's files: the best checkpoint (`checkpoint`, by val/acc), last.ckpt
    (`last_checkpoint`), last-step.ckpt (`--checkpoint_every_n_steps`), `--find_label_issues`, `lr_monitor`."""
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
        "--find_label_issues",
        type=bool,
        default=False,
        help="for a folder: write label_issues.csv beside the logs, the training files whose label looks wrong "
        "(the run's training dynamics ranked by cleanlab; vit/evaluation/label_issues.py)",
    )
    parser.add_lightning_class_args(LearningRateMonitor, "lr_monitor")
    parser.set_defaults({"lr_monitor.logging_interval": "step"})


def callbacks_to_keep(config, callbacks: list, needs_logger: tuple[type, ...] = ()) -> tuple[list, bool]:
    """The callbacks a run keeps, and whether it has no logger. Those whose need a flag turned off are left out, as
    Lightning leaves out its own: with no logger the learning-rate monitor and `needs_logger` (the attention maps);
    with `enable_checkpointing false` every ModelCheckpoint; one of `needs_logger` whose `every_n_epochs` is 0."""
    logger = config.get("logger")
    no_logger = logger is False or logger is None or logger == []
    keep = []
    for cb in callbacks:
        if no_logger and isinstance(cb, (LearningRateMonitor, *needs_logger)):
            continue
        if config.get("enable_checkpointing") is False and isinstance(cb, ModelCheckpoint):
            continue
        if isinstance(cb, needs_logger) and cb.every_n_epochs == 0:
            continue
        keep.append(cb)
    return keep, no_logger


def resume_target(ckpt: str | None, trainer: L.Trainer) -> str | None:
    """`--ckpt_path last`: the newest last*.ckpt of this run's name (ValueError when there is none); for a checkpoint
    of checkpoints/<name>/version_<n>/, the logger is set to version_<n> so logs and checkpoints continue there. The
    checkpoint to resume from, or None when there is none or no logger."""
    logger = trainer.logger
    if not ckpt or logger is None:
        return None
    if ckpt == "last":
        found, runs = newest_last_checkpoint(trainer.default_root_dir, logger.name)
        if found is None:
            raise ValueError(f"--ckpt_path last: no last*.ckpt under {runs}/ to resume from")
        ckpt = str(found)
    if (version := version_of(ckpt, logger.name)) is not None:
        # Private: a built logger has no public setter of its version (only the constructor's `version`), and the
        # Trainer is built before the checkpoint to resume is known. Set before anything asks the logger for its
        # folder; tests/test_commands.py test_the_private_lightning_api_we_override_is_still_there guards it.
        logger._version = version
    return ckpt


def step_checkpoint(every: int | None) -> ModelCheckpoint:
    """last-step.ckpt, which bounds the work a kill can cost: every `every` training steps, else every 5 minutes."""
    if every is not None and every < 1:
        raise ValueError(f"checkpoint_every_n_steps={every} must be >= 1")
    step_ckpt = dict(filename="last-step", monitor=None, save_top_k=1, enable_version_counter=False)
    if every:
        return ModelCheckpoint(every_n_train_steps=every, **step_ckpt)
    return TimedCheckpoint(STEP_CHECKPOINT_EVERY, **step_ckpt)  # no broadcast per step, unlike Lightning's


def prepare_checkpoints(trainer: L.Trainer, datamodule, config) -> None:
    """Before fit: the mid-epoch checkpoint and the data record beside the checkpoints, the checkpoints' folder
    (checkpoints/<run>/version_<n>/ unless a dirpath was given), val/mAP as the best checkpoint's measure for several
    labels an image, TF32 matmuls on CUDA, and split.csv (which file went to which split) beside the logs."""
    if trainer.checkpoint_callbacks:  # none with --trainer.enable_checkpointing false
        trainer.callbacks.append(step_checkpoint(config.get("checkpoint_every_n_steps")))
        trainer.callbacks.append(DataRecord(plain_data_config(config.get("data"))))
    if trainer.strategy.root_device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 matmuls for fp32 on Ampere and newer
    logger = trainer.logger
    folder = checkpoint_folder(trainer.default_root_dir, logger)
    for cb in trainer.checkpoint_callbacks:
        if cb.dirpath is None:
            cb.dirpath = str(folder.resolve())
        if cb.monitor == "val/acc" and getattr(datamodule, "task", None) == "multilabel":
            cb.monitor = "val/mAP"  # several labels an image: no accuracy; the ranking of each label's scores
    if logger and trainer.is_global_zero and getattr(datamodule, "samples", None):
        # the validation split is made here, seeded (the same on resume)
        write_split(Path(logger.log_dir, "split.csv"), datamodule.root, datamodule.samples, datamodule.listing)


def best_checkpoint_lines(trainer: L.Trainer, start: float) -> tuple[str | None, list[str]]:
    """After fit: the lines that say the best score and where the best and last checkpoints are (or the last epoch's
    val/acc when none was written), and the checkpoints written (best, last)."""
    cbs = trainer.checkpoint_callbacks
    cb = next((c for c in cbs if c.monitor), None)
    last = next((c for c in cbs if c.monitor is None and c.filename == "last"), None)
    took = f"after {time.perf_counter() - start:.0f} s"
    text = None
    if cb is not None and cb.best_model_path:
        score = cb.best_model_score
        if score is None:  # ddp_spawn hands the best path back to the launcher, not its score: read it there
            score = load_checkpoint(cb.best_model_path)["callbacks"]
            score = next(v["best_model_score"] for k, v in score.items() if "ModelCheckpoint" in k and v["monitor"])
        text = f"\nbest {cb.monitor} {float(score):.4f} {took}\ncheckpoint: {cb.best_model_path}" + (
            f"\nlast:       {last.best_model_path}" if last is not None else ""
        )
    elif (acc := trainer.callback_metrics.get("val/acc")) is not None:
        text = f"\nval/acc {float(acc):.4f} (last epoch) {took}; no checkpoint written"
    return text, [c.best_model_path for c in (cb, last) if c is not None and c.best_model_path]
