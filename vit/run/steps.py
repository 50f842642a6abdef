"""The steps `vit-train` adds around Lightning's, in the order they run; vit/commands/train.py parses and calls them.

    check_ckpt_path the command line parsed: a checkpoint to resume or score is read as data before Lightning reads it
    before_build    the config parsed, nothing built: the DDP memory share, pretrained weights, the plan, precision
    before_fit      the trainer built: resume in place, checkpoint folders, split.csv, label issues, plan and budget
    after_fit       the best checkpoint's line, then calibration, logit adjustment, `unknown` and the test split

They live here, above training/ and evaluation/ (the package ranks in vit/__init__.py), because they call both: the
plan (vit/planning/), the run's folders and checkpoints (vit/training/run.py) and the after-fit passes
(vit/evaluation/after_fit.py).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only

from vit.evaluation.after_fit import after_fit_lines
from vit.evaluation.label_issues import label_issue_finder
from vit.model.checkpoint import load_checkpoint
from vit.planning.explicit import explicit_keys, is_explicit
from vit.planning.plan import Plan
from vit.run.estimate import RunEstimate
from vit.run.planned import apply_plan, keep_plan_and_budget, plan_yaml
from vit.run.trainer import apply_precision
from vit.run.weights import apply_weights
from vit.training.run import best_checkpoint_lines, prepare_checkpoints, resume_target, share_memory_budget
from vit.training.run_folders import run_files_folder

Planned = tuple[Plan, float | None]  # apply_plan: the plan and its deadline (a time.time() value; None: no budget)


class Prepared(NamedTuple):
    """What before_build decided, for the steps after it."""

    planned: Planned | None = None  # the plan, if one was made
    precision_line: str | None = None  # printed once the data is built (say_precision)
    typed_precision: bool = False  # a precision you typed: timed against fp32 when training starts (RunEstimate)


def _explicit(config, argv: Sequence[str]) -> set[str]:
    return explicit_keys(argv, [str(p) for p in (config.get("config") or [])])


def check_ckpt_path(ckpt: str | None) -> None:
    """Raise CheckpointError, naming the file, for a `--ckpt_path` that is missing, truncated or carries a pickle
    (loaded with weights_only=True); "last" is found later (resume_target)."""
    if ckpt and ckpt != "last":
        load_checkpoint(ckpt)


def before_build(config, subcommand: str | None, argv: Sequence[str]) -> Prepared:
    """The subcommand's parsed `config` made ready to build, in place: each local process's share of the decoded-image
    memory, then for `fit` the pretrained weights (their architecture is the model, so a plan is a fine-tune of it)
    and the plan (a folder is then decoded once, at the planned size), then the precision (`auto` follows this machine).
    Returns the plan, if one was made; the precision's line to print once the data is built (say_precision): a data
    source that is missing is then the first and only line; and whether the precision is one you typed, which the
    run times when it starts (RunEstimate), where the rule's choice (`auto`, a plan's) was timed already. Weights or a
    plan that cannot run: ValueError."""
    share_memory_budget(config)
    planned = None
    explicit, requested = _explicit(config, argv), str(config.trainer.get("precision"))
    typed = requested != "auto" and is_explicit("trainer.precision", explicit)  # yours: the plan times it too
    if str(config.get("model.init_from") or "").lower() == "none":
        config.model.init_from = None  # `--model.init_from none`: from scratch, where a plan would choose weights too
    if subcommand == "fit":
        if config.get("ckpt_path"):  # the checkpoint holds the weights; the files may have moved since
            config.model.init_from = config.model.stem_from = None
        weights = apply_weights(config, argv)
        planned = apply_plan(config, argv, weights=weights, precision=requested if typed else None)
    return Prepared(planned, apply_precision(config, explicit), typed)


def say_precision(prepared: Prepared) -> None:
    """before_build's precision line, on rank 0 (a warning to stderr)."""
    said = prepared.precision_line
    if said and rank_zero_only.rank == 0:
        print(said, file=sys.stderr if said.startswith("warning") else sys.stdout, flush=True)


def before_fit(
    trainer: L.Trainer, datamodule, config, *, prepared: Prepared, argv: Sequence[str], parser
) -> str | None:
    """The trainer built, fit not started: returns the checkpoint to resume from (`--ckpt_path last`: the newest in
    the run's folder, which the run then continues) and adds to the trainer the mid-epoch checkpoint, split.csv, the
    label-issue finder (`--find_label_issues`), the plan's budget and plan.yaml (`parser` writes it), and the line
    that says how long the run will take here (with a bf16 you typed timed against fp32 on a CPU). `prepared`:
    before_build's answer. A folder that cannot be written: ValueError."""
    planned = prepared.planned
    ckpt = resume_target(config.get("ckpt_path"), trainer)
    prepare_checkpoints(trainer, datamodule, config)
    folder = None  # beside the logs, else the checkpoints; asked only when a file goes there
    if config.get("find_label_issues") or planned is not None:
        folder = run_files_folder(trainer.logger, trainer.checkpoint_callbacks)
    if config.get("find_label_issues"):
        trainer.callbacks.append(label_issue_finder(datamodule, folder))
    if planned is not None:
        plan, deadline = planned
        keep_plan_and_budget(
            trainer,
            plan,
            deadline,
            folder,
            yaml_of=lambda epochs: plan_yaml(parser, config, epochs, plan),
            budget_owned=not is_explicit("trainer.max_epochs", _explicit(config, argv)),
        )
    # say early how long it will take here, and again if that changes
    trainer.callbacks.append(RunEstimate(check_bf16=prepared.typed_precision))
    return ckpt


def after_fit(trainer: L.Trainer, datamodule, hparams, start: float) -> Iterator[str]:
    """On rank 0 once fit ends, each line as its step is done: the best score and where the checkpoints are, then
    (checkpoints written) calibration, logit adjustment, the `unknown` record and the test split
    (vit/evaluation/after_fit.py). `start`: time.perf_counter() when fit began."""
    text, saved = best_checkpoint_lines(trainer, start)
    if text:
        yield text
    if saved:
        tb = next((lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)
        yield from after_fit_lines(saved, datamodule, hparams, trainer.strategy.root_device, tb, trainer.global_step)
