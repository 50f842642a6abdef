"""How long a fixed recipe will take on this machine: one line, early in the first epoch, from a few timed steps."""

import logging

import lightning as L
import torch

log = logging.getLogger(__name__)

# The bf16 check's steps: a warm-up and two timed steps at batch 2, in fp32 and in bf16.
CHECK_STEPS = 6


class RunEstimate(L.Callback):
    """One line, early in the first epoch of a fixed recipe: how long the whole run will take on this machine, from
    a few timed training steps (the first `skip` left out: allocation, lazy initialisation), and how many epochs
    would fit in an hour. Two clock reads in the whole run (each a device synchronisation on a GPU); nothing after."""

    def __init__(self, skip: int = 2, timed: int = 5):
        self.skip, self.timed = skip, timed
        self._t0: float | None = None
        self.estimate_s: float | None = None  # the whole run's estimated seconds, once printed
        self.bf16_slowdown: float | None = None  # fp32's speed over bf16's, measured when a CPU run asks for bf16

    def on_train_start(self, trainer, pl_module) -> None:
        """bf16-mixed on a CPU: a few steps of the model at batch 2 in fp32 and in bf16 first. CPUs without bf16
        instructions (AVX2 only) run bf16 ~12x slower (docs/performance.md); say so before the first real step, which
        would otherwise be the first sign. GPUs are not checked: bf16 is their fast path, and neither is a run of at
        most CHECK_STEPS steps (a smoke run, fast_dev_run): there the check would take as long as the run."""
        if pl_module.device.type != "cpu" or "bf16" not in str(trainer.precision):
            return
        if trainer.estimated_stepping_batches <= CHECK_STEPS:
            return
        from vit.planning.plan import BF16_GAIN
        from vit.planning.speed import calibrate

        cfg = pl_module.model.cfg
        fp32, bf16 = (
            calibrate([cfg], 2, "cpu", p, steps=CHECK_STEPS // 2 - 1, warmup=1)[0] for p in ("32-true", "bf16-mixed")
        )
        if fp32 > BF16_GAIN * bf16:
            self.bf16_slowdown = fp32 / bf16
            if trainer.is_global_zero:
                print(f"bf16-mixed {self._bf16_note()}", flush=True)

    def _bf16_note(self) -> str:
        return f"measured {self.bf16_slowdown:.1f}x slower than fp32 on this CPU: --trainer.precision 32-true"

    @staticmethod
    def _now(pl_module) -> float:
        import time

        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        return time.perf_counter()

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        n = trainer.num_training_batches  # inf for an iterable without a length
        n = self.skip + self.timed if n == float("inf") else int(n)
        # a short epoch (limit_train_batches) times what it has: at least one step, skipping fewer first
        self._timed = max(1, min(self.timed, n - self.skip))
        self._skip = max(0, min(self.skip, n - self._timed))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if trainer.current_epoch == 0 and self.estimate_s is None and batch_idx == self._skip:
            self._t0 = self._now(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.current_epoch != 0 or self.estimate_s is not None or self._t0 is None:
            return
        if batch_idx == self._skip + self._timed - 1:
            self._report(trainer, pl_module, (self._now(pl_module) - self._t0) / self._timed)

    def _report(self, trainer, pl_module, step_s: float) -> None:
        from vit.planning.plan import EPOCH_OVERHEAD

        train_batches = trainer.num_training_batches
        val_batches = sum(trainer.num_val_batches) if trainer.num_val_batches else 0
        # validation is forward-only, about a third of a training step per batch of the same size (vit/planning/plan.py)
        epoch_s = train_batches * step_s * EPOCH_OVERHEAD + val_batches * step_s / 3
        epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else 1
        self.estimate_s = epochs * epoch_s
        device = pl_module.device
        where = f"{device.type}, {torch.cuda.get_device_name(device)}" if device.type == "cuda" else f"cpu, {cores()}"
        line = (
            f"this recipe: {epochs} epochs of {train_batches} steps, about {duration(self.estimate_s)} on this "
            f"machine ({where}; {step_s:.2f} s a step)"
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
        if trainer.is_global_zero:
            print(line, flush=True)


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
