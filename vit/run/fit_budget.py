"""FitBudget: a planned run kept inside its time budget, its epochs and learning-rate schedule resized to the speed its
epochs measure (vit/run/planned.py adds it to a planned fit)."""

from __future__ import annotations

import time
from collections.abc import Callable

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from vit.planning.rules import FIXED_S
from vit.training.freezing import frozen_epochs
from vit.training.schedules import lr_factor, schedule_warmup

# Of the remaining budget, kept free when FitBudget resizes the run: timed epochs leave out the attention maps (five
# times a run) and the drift of a shared machine. With 5% and one timed epoch, runs ended 7-11% over 3 and 5 minutes.
RESERVE = 0.10


class FitBudget(L.Callback):
    """Keeps a planned run inside its budget. The plan's epoch time comes from a few timed model steps; once real
    epochs (training, validation, checkpoints) have been timed, max_epochs and the cosine schedule with it are set to
    what fits before the deadline. It times the first two epochs when warmup lasts two or more (their mean: on this
    shared 2-core machine single MNIST epochs ranged 4.5-8.0 s around a 5.9 s mean, and the first carries one-time
    costs), else the first. Either way the resize happens inside warmup, which does not depend on the total, so the
    run is the same as one planned with the new epoch count from the start (plan.yaml is rewritten with it), and the
    schedule still completes.

    Epochs with frozen parameters (`freeze_stem_epochs`, `freeze_backbone_epochs`) are not timed: they skip the
    backward pass through what is frozen, so they cost less than the rest (the hybrid's first epoch on the cells took
    7.4 s where the next ones took ~16 s, and timing it resized a 5-minute run from 18 epochs to 32, then cut it back
    to 17 in four steps, its cosine squeezed each time). The timing starts at the first epoch that trains everything
    instead, so the resize lands just past a one-epoch warmup, where the cosine has barely moved (from 18 planned
    epochs to 17, the rate goes from 0.992 of its peak to 0.990)."""

    def __init__(
        self,
        deadline: float,
        cap: int,
        on_change: Callable[[int], None] | None = None,
        clock: Callable[[], float] = time.time,
        teardown_s: float = FIXED_S / 2,
    ):
        self.deadline, self.cap, self.on_change, self.clock = deadline, cap, on_change, clock
        self.teardown_s = teardown_s
        self._start: float | None = None  # when the first timed epoch started
        self._starts: list[float] = []  # when each timed epoch started

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        now, epoch, hp = self.clock(), trainer.current_epoch, pl_module.recipe
        frozen = frozen_epochs(hp)
        if epoch == frozen:
            self._start, self._starts = now, []
        if epoch >= frozen:
            self._starts.append(now)
        at = frozen + max(1, min(2, int(hp.warmup_epochs)))  # the epoch whose start ends the timing
        if epoch > at and self._start is not None:
            self.keep_in_budget(trainer, pl_module, now, epoch)
        if epoch == at and self._start is not None:
            epoch_s = (now - self._start) / (at - frozen)
            left = self.deadline - now - self.teardown_s
            fit = at + int(left * (1 - RESERVE) // epoch_s)
            # every rank of a DDP run must stop after the same epoch: rank 0's clock decides
            epochs = trainer.strategy.broadcast(max(at + 1, min(self.cap, fit)), src=0)
            self.resize(trainer, pl_module, epochs, epoch_s, note=self.capped(fit, left - (epochs - at) * epoch_s))

    def keep_in_budget(self, trainer, pl_module, now: float, epoch: int) -> None:
        """After the sizing, follow the machine: when the epochs run longer than the timed ones (a shared machine
        slowed down: 12 s epochs became 15 s in a 15-minute run here, which then ended 8% over), end earlier; when
        they run shorter and at least two more epochs fit with the reserve kept (runs here ended 14% and 25% early),
        train longer. The rest of the learning-rate schedule is played faster or slower to fit, so the run still ends
        at its last learning rate."""
        recent = self._starts[-4:]  # the last three epochs, or fewer
        epoch_s = (recent[-1] - recent[0]) / (len(recent) - 1)
        left = self.deadline - self.teardown_s - now
        if now + (trainer.max_epochs - epoch) * epoch_s + self.teardown_s > self.deadline:
            fit = epoch + int(left // epoch_s)  # over: as many as fit, no reserve
        else:
            fit = epoch + int(left * (1 - RESERVE) // epoch_s)
            if fit < trainer.max_epochs + 2:  # on time, or too little to gain
                return
        epochs = trainer.strategy.broadcast(max(epoch + 1, min(self.cap, fit)), src=0)
        if epochs == trainer.max_epochs:
            return
        steps_per_epoch = trainer.estimated_stepping_batches / trainer.max_epochs
        done, total, new_total = (round(steps_per_epoch * e) for e in (epoch, trainer.max_epochs, epochs))
        for cfg in trainer.lr_scheduler_configs:
            cfg.scheduler.lr_lambdas = [compressed(f, done, total, new_total) for f in cfg.scheduler.lr_lambdas]
        how = "played faster" if epochs < trainer.max_epochs else "stretched"
        why = self.capped(fit, left - (epochs - epoch) * epoch_s)
        rank_zero_info(
            f"budget: epochs now take {epoch_s:.1f} s, so the run ends after {epochs} epochs instead of "
            f"{trainer.max_epochs}; the rest of the schedule is {how} to fit{why}"
        )
        trainer.fit_loop.max_epochs = epochs
        if self.on_change is not None:
            self.on_change(epochs)

    def capped(self, fit: int, unspent_s: float) -> str:
        """Why a run ends before its deadline: the plan's most epochs (`cap`), and the seconds that leaves."""
        if fit <= self.cap:
            return ""
        return f" ({self.cap}, the plan's most epochs: ~{max(0.0, unspent_s):.0f} s of the budget left unspent)"

    def resize(self, trainer, pl_module, epochs: int, epoch_s: float, note: str = "") -> None:
        old = trainer.max_epochs
        if epochs == old:
            return
        steps_per_epoch = trainer.estimated_stepping_batches / old
        total = max(1, round(steps_per_epoch * epochs))
        hp = pl_module.recipe
        warmup = schedule_warmup(hp.warmup_epochs, steps_per_epoch, total, epochs)
        trainer.fit_loop.max_epochs = epochs
        for cfg in trainer.lr_scheduler_configs:
            lams = cfg.scheduler.lr_lambdas  # one per parameter group
            cfg.scheduler.lr_lambdas = [lr_factor(hp, warmup, total)] * len(lams)
        rank_zero_info(
            f"budget: an epoch takes {epoch_s:.1f} s here, so {epochs} epochs instead of {old} finish in time; "
            "the cosine schedule is resized with them" + note
        )
        if self.on_change is not None:
            self.on_change(epochs)


def compressed(factor: Callable[[int], float], done: int, total: int, new_total: int) -> Callable[[int], float]:
    """A learning-rate schedule whose steps after `done` are played faster (or slower, when new_total > total), so
    that what took until `total` ends at `new_total`: continuous at `done`, and ending where the original ended."""
    rate = (total - done) / max(1, new_total - done)
    return lambda step: factor(step) if step < done else factor(min(total, done + (step - done) * rate))
