"""A checkpoint every few minutes of training, without a collective at every step.

Lightning's `ModelCheckpoint(train_time_interval=...)` asks rank zero's clock at every `on_train_batch_end` and
broadcasts the answer (`trainer.strategy.broadcast`: a pickle, a collective and a wait, every step under DDP), so that
the ranks agree. Here the ranks agree by the step count instead: rank zero's clock is consulted only at planned check
steps, and one broadcast there carries both the decision and the step of the next check, planned from the measured
time per step so that it lands about when the interval is up. A few collectives per interval instead of one per step.
"""

import time
from datetime import timedelta

from lightning.pytorch.callbacks import ModelCheckpoint

FIRST_CHECK = 10  # steps before the first measurement of the step time


class TimedCheckpoint(ModelCheckpoint):
    """`ModelCheckpoint` (every other argument as Lightning's) that saves every `interval` of training time."""

    def __init__(self, interval: timedelta, **kwargs):
        super().__init__(every_n_train_steps=0, train_time_interval=None, **kwargs)
        self.interval = interval.total_seconds()
        self.checks = 0  # collectives so far (a test reads it)
        self._next_check: int | None = None
        self._mark: tuple[float, int] = (0.0, 0)  # (clock, step) of the last check
        self._saved_at = 0.0  # clock of the last save (or of the start)

    def on_train_start(self, trainer, pl_module) -> None:
        now = time.monotonic()
        self._mark, self._saved_at = (now, trainer.global_step), now
        self._next_check = trainer.global_step + FIRST_CHECK

    def _plan(self, step: int) -> tuple[bool, int]:
        """On rank zero: whether to save now, and the step of the next check."""
        now = time.monotonic()
        per_step = (now - self._mark[0]) / max(1, step - self._mark[1])
        self._mark = (now, step)
        due = now - self._saved_at >= self.interval
        left = self.interval if due else self.interval - (now - self._saved_at)
        return due, step + max(1, round(left / max(per_step, 1e-9)))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        step = trainer.global_step
        if self._next_check is None or step < self._next_check:
            return  # a host integer comparison, the same on every rank
        self.checks += 1
        due, self._next_check = trainer.strategy.broadcast(self._plan(step))  # rank zero's plan for every rank
        if not due:
            return
        self._saved_at = time.monotonic()
        self._every_n_train_steps = max(1, step)  # Lightning's own step-based save, exactly at this step
        try:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        finally:
            self._every_n_train_steps = 0
