"""How long a run will take on this machine: one line after its first few steps (planned or not), and another whenever
the speed changes by more than SPEED_CHANGE (a shared machine slowing down, a phase with other shapes)."""

import logging
import math
import time

import lightning as L
import torch

from vit.planning.rules import EPOCH_OVERHEAD, FORWARD_SHARE
from vit.training.freezing import frozen_epochs

log = logging.getLogger(__name__)

# Runs of at most this many steps are not checked for a slow bf16 (the check's own steps would double them).
CHECK_STEPS = 6
# After the first line, the speed is re-read every RECHECK_STEPS steps inside an epoch (one clock read, no device
# synchronisation: over that many steps a GPU's queue is full, so the wall clock is its speed), and a line printed
# when it differs from the last printed one by more than this factor.
RECHECK_STEPS, SPEED_CHANGE = 50, 1.5


class RunEstimate(L.Callback):
    """One line after the first few training steps of any fit (the first `skip` left out: allocation, lazy
    initialisation): seconds a step, the steps left, the expected wall time to the end and to the next checkpoint, and
    for a run over an hour the way to a shorter one; then a line whenever the speed changes by more than SPEED_CHANGE.
    A few clock reads a run (each a device synchronisation on a GPU only for the first line); nothing else.
    `check_bf16`: time a bf16 on a CPU against fp32 before the first step (the CLI: only a precision you typed; the
    rule's own choice was timed when it was made, and a second timing could contradict the first)."""

    def __init__(self, skip: int = 2, timed: int = 5, check_bf16: bool = True):
        self.skip, self.timed, self.check_bf16 = skip, timed, check_bf16
        self.overhead = EPOCH_OVERHEAD  # a real step over a timed one (epoch_overhead), set when training starts
        self._fit_start: float | None = None  # the clock when training started: the run's time so far is measured
        self._t0: float | None = None
        self.estimate_s: float | None = None  # the whole run's estimated seconds, once printed
        self.step_s: float | None = None  # the speed last printed
        self.lines: list[str] = []  # what was printed, in order
        self._mark: tuple[float, int] | None = None  # (clock, global step) where the current speed reading began
        self.bf16_slowdown: float | None = None  # fp32's speed over bf16's, measured when a CPU run asks for bf16

    def on_train_start(self, trainer, pl_module) -> None:
        self._fit_start, self.overhead = self._now(pl_module, sync=False), epoch_overhead(pl_module)
        self._check_bf16(trainer, pl_module)

    def _check_bf16(self, trainer, pl_module) -> None:
        """bf16-mixed on a CPU: the precision rule's answer first (vit/planning/precision.py decide_precision: the
        CPU's flags, else a few steps of the model in fp32 and in bf16). CPUs without bf16 instructions (AVX2 only)
        emulate it, many times slower (docs/performance.md); say so before the first real step, which would otherwise
        be the first sign. GPUs are not checked: bf16 is their fast path, and neither is a run of at
        most CHECK_STEPS steps (a smoke run, fast_dev_run): there the check would take as long as the run."""
        if not self.check_bf16 or pl_module.device.type != "cpu" or "bf16" not in str(trainer.precision):
            return
        if trainer.estimated_stepping_batches <= CHECK_STEPS:
            return
        from vit.planning.precision import decide_precision, probe

        timed = []  # (fp32, bf16) images/s, where the rule measures them
        chosen, _ = decide_precision("cpu", lambda: timed.append(probe(pl_module.model.cfg)) or timed[0])
        if chosen == "32-true":
            self.bf16_slowdown = timed[0][0] / timed[0][1] if timed else math.inf  # inf: emulated, not timed
            if trainer.is_global_zero:
                print(f"bf16-mixed {self._bf16_note()}", flush=True)

    def _bf16_note(self) -> str:
        if math.isinf(self.bf16_slowdown):
            return "is emulated on this CPU (no native bf16), many times slower than fp32: --trainer.precision 32-true"
        return f"measured {self.bf16_slowdown:.1f}x slower than fp32 on this CPU: --trainer.precision 32-true"

    @staticmethod
    def _now(pl_module, sync: bool = True) -> float:
        if sync and pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        return time.perf_counter()

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._mark = None  # a speed reading never spans validation
        n = trainer.num_training_batches  # inf for an iterable without a length
        n = self.skip + self.timed if n == float("inf") else int(n)
        n = min(n, max(1, int(trainer.estimated_stepping_batches)))  # max_steps may stop the run sooner
        # a short run (limit_train_batches, max_steps) times what it has: at least one step, skipping fewer first
        self._timed = max(1, min(self.timed, n - self.skip))
        self._skip = max(0, min(self.skip, n - self._timed))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        # timed in the first epoch that trains everything: frozen epochs skip part of the backward pass (the hybrid's
        # first took half the time of the next), so their steps would promise half the run's time
        first = frozen_epochs(pl_module.recipe)
        if trainer.current_epoch == first and self.estimate_s is None and batch_idx == self._skip:
            self._t0 = self._now(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self.estimate_s is None:
            if self._t0 is not None and batch_idx == self._skip + self._timed - 1:
                self._report(trainer, pl_module, (self._now(pl_module) - self._t0) / self._timed)
                self._mark = (self._now(pl_module, sync=False), trainer.global_step)
            return
        if self._mark is None:
            self._mark = (self._now(pl_module, sync=False), trainer.global_step)
            return
        steps = trainer.global_step - self._mark[1]
        if steps < RECHECK_STEPS:
            return
        now = self._now(pl_module, sync=False)
        step_s = (now - self._mark[0]) / steps
        self._mark = (now, trainer.global_step)
        if max(step_s / self.step_s, self.step_s / step_s) > SPEED_CHANGE:
            self._again(trainer, step_s)

    def _timings(self, trainer, step_s: float) -> tuple[int, float, float]:
        """(steps left, seconds to the end, seconds to the next checkpoint: the end of this epoch's validation)."""
        train_batches = trainer.num_training_batches
        train_batches = int(train_batches) if train_batches != float("inf") else 0
        val_batches = sum(trainer.num_val_batches) if trainer.num_val_batches else 0
        val_s = val_batches * step_s * FORWARD_SHARE  # validation is forward-only
        epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else 1
        total = int(getattr(trainer, "estimated_stepping_batches", epochs * train_batches))
        left = max(0, total - getattr(trainer, "global_step", 0))
        loop = getattr(trainer, "fit_loop", None)
        done_in_epoch = loop.epoch_loop.batch_progress.current.ready if loop is not None else 0
        in_epoch = (train_batches - done_in_epoch) if train_batches else left
        epochs_left = math.ceil(left / train_batches) if train_batches else 1
        to_end = left * step_s * self.overhead + epochs_left * val_s
        to_checkpoint = min(left, max(0, in_epoch)) * step_s * self.overhead + val_s
        return left, to_end, to_checkpoint

    def _report(self, trainer, pl_module, step_s: float) -> None:
        self.step_s = step_s
        train_batches = trainer.num_training_batches
        val_batches = sum(trainer.num_val_batches) if trainer.num_val_batches else 0
        epoch_s = train_batches * step_s * self.overhead + val_batches * step_s * FORWARD_SHARE
        epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else 1
        total = int(getattr(trainer, "estimated_stepping_batches", epochs * train_batches))
        left, to_end, to_checkpoint = self._timings(trainer, step_s)
        # the time run so far as measured (a frozen first epoch ran faster than the steps timed after it)
        done = getattr(trainer, "global_step", 0) * step_s * self.overhead
        ran = self._now(pl_module, sync=False) - self._fit_start if self._fit_start is not None else done
        self.estimate_s = to_end + ran
        device = pl_module.device
        where = f"{device.type}, {torch.cuda.get_device_name(device)}" if device.type == "cuda" else f"cpu, {cores()}"
        shape = (
            f"{epochs} epochs of {train_batches} steps"
            if train_batches != float("inf") and total >= epochs * train_batches
            else f"{total} steps"
        )
        line = (
            f"this recipe: {shape}, about {duration(self.estimate_s)} on this machine ({where}; {step_s:.2f} s a "
            f"step); {left} steps left: the end in ~{duration(to_end)}, the next checkpoint in "
            f"~{duration(to_checkpoint)}"
        )
        if self.estimate_s > 3600:
            from vit.data.sources import PLANNED, public_class_path

            dm = getattr(trainer, "datamodule", None)
            if dm is not None and public_class_path(f"{type(dm).__module__}.{type(dm).__name__}") in PLANNED:
                line += (
                    "; --budget 1h plans a run that fits"  # the planner reads this data source (vit/data/sources.py)
                )
            fit = max(1, int(3600 // epoch_s))
            line += f"; --trainer.max_epochs {fit} fits in about an hour"
        if self.bf16_slowdown:
            line += f"; bf16-mixed {self._bf16_note()}"
        self._say(trainer, line)

    def _again(self, trainer, step_s: float) -> None:
        ratio = step_s / self.step_s
        self.step_s = step_s
        left, to_end, to_checkpoint = self._timings(trainer, step_s)
        self._say(
            trainer,
            f"estimate: now {step_s:.2f} s a step ({ratio:.1f}x); {left} steps left: the end in "
            f"~{duration(to_end)}, the next checkpoint in ~{duration(to_checkpoint)}",
        )

    def _say(self, trainer, line: str) -> None:
        self.lines.append(line)
        if trainer.is_global_zero:
            print(line, flush=True)


def epoch_overhead(pl_module) -> float:
    """A real step over a timed one: a small ViT's EPOCH_OVERHEAD (the augmentation, metrics and logging around a
    cheap step); a hybrid's HYBRID_EPOCH_OVERHEAD (its CNN dominates the step: planned runs ran at 0.99x their timed
    steps, where 1.2 promised a 15-minute run 17 minutes)."""
    from vit.model.config import HYBRID_STEMS
    from vit.planning.hybrid_plan import HYBRID_EPOCH_OVERHEAD

    arch = getattr(getattr(pl_module, "hparams", None), "arch", None) or {}
    return HYBRID_EPOCH_OVERHEAD if arch.get("stem") in HYBRID_STEMS else EPOCH_OVERHEAD


def cores() -> str:
    import os

    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{n} cores"


def duration(seconds: float) -> str:
    """4000 -> '1.1 h', 300 -> '5 min', 40 -> '40 s'."""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"
