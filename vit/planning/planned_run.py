"""A planned training run: vit/planning/plan.py's recipe applied to the parsed config, kept inside its time budget, and
saved.

    vit-train fit --data.root PATH                   # configs/folder.yaml: plan: true
    vit-train fit --data.root PATH --budget 5min     # model and epochs chosen to finish in 5 minutes, start to exit
    vit-train --budget 30min                         # CIFAR-10 (configs/cifar10.yaml's data, a planned recipe)
    vit-train --config configs/mnist.yaml --data.init_args.dataset torch/fashion_mnist --budget 5min

vit/planning/fit_steps.py calls `apply_plan` before anything is built (a folder is decoded once, at the planned size),
then `keep_plan_and_budget`, which adds the `FitBudget` callback and writes <run>/plan.yaml: the complete config,
`plan: false`, so that `vit-train fit --config <run>/plan.yaml` trains the same run again without planning.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from vit.data.sources import source_for
from vit.model.cnn_weights import CnnWeights, read_cnn_weights
from vit.model.config import follows_patch_grid
from vit.model.pretrained import Pretrained
from vit.planning.budget import parse_budget, process_start
from vit.planning.explicit import explicit_keys, is_explicit
from vit.planning.fine_tune import apply_cnn_weights
from vit.planning.fine_tune_plan import make_fine_tune_plan
from vit.planning.fingerprint import fingerprint
from vit.planning.hybrid_plan import make_hybrid_plan
from vit.planning.plan import FIXED_S, Plan, make_plan, warmup_epochs
from vit.planning.speed import Machine
from vit.planning.start import choose_start
from vit.training.schedules import lr_factor, schedule_warmup

# Of the remaining budget, kept free when FitBudget resizes the run: timed epochs leave out the attention maps (five
# times a run) and the drift of a shared machine. With 5% and one timed epoch, runs ended 7-11% over 3 and 5 minutes.
RESERVE = 0.10


def apply_plan(
    config, argv: Sequence[str], clock: Callable[[], float] = time.time, weights: Pretrained | CnnWeights | None = None
) -> tuple[Plan, float | None] | None:
    """Plan when `config.plan` or `--budget` asks for it: fingerprint the data (any source of vit/data/sources.py),
    calibrate, write the plan's values into `config` (a jsonargparse Namespace of `fit`) wherever the user did not
    set the key. With `weights` (read by vit/planning/fine_tune.py, which put their model into the config) the plan
    is a fine-tune of that model (vit/planning/fine_tune_plan.py). Returns (the plan, the deadline as a `clock`
    time) or None when not planning. Raises ValueError with one line when it cannot plan."""
    budget = parse_budget(config.get("budget"))
    max_time = config.trainer.get("max_time")
    if not config.get("plan") and budget is None:
        return None
    if config.get("ckpt_path"):  # a new plan could choose another model than the checkpoint's
        raise ValueError(
            f"ckpt_path={config.ckpt_path}: resume a planned run from its saved plan, not a new one: "
            "vit-train fit --config logs/<run>/version_<n>/plan.yaml --ckpt_path ..."
        )
    if budget is None and max_time is not None:
        budget = parse_budget(max_time)  # the plan fits the whole schedule in it instead of cutting it short
    if budget is not None:
        config.trainer.max_time = None
    start = process_start()
    fp = fingerprint(source_for(config.data))
    explicit = explicit_keys(argv, [str(p) for p in (config.get("config") or [])])
    if isinstance(weights, CnnWeights):  # a CNN's ImageNet weights: the hybrid (vit/planning/hybrid_plan.py)
        plan = make_hybrid_plan(fp, Machine.here(), budget, clock() - start, arch=weights.arch, source=weights.source)
    elif weights is not None:
        arch = {**config.model.arch.as_dict(), "img_size": weights.arch["img_size"]}  # their own resolution
        source = weights.source
        plan = make_fine_tune_plan(fp, Machine.here(), budget, clock() - start, arch=arch, source=source)
    else:
        plan = plan_a_start(config, fp, budget, explicit, lambda: clock() - start)
    yours = []
    for key, value in plan.overrides.items():
        if is_explicit(key, explicit):
            yours.append(f"{key}={config.get(key)}")
        else:
            config[key] = tuple(value) if isinstance(value, list) else value
    if config.get("model.arch.patch_drop_rate") and not is_explicit("model.arch.patch_drop_rate", explicit):
        arch = config.model.arch
        if follows_patch_grid(arch.get("attn_pattern", "global"), arch.get("rope"), arch.get("pos_embed")):
            # your attention follows the patch grid (the model refuses PatchDropout there): train every token
            config.model.arch.patch_drop_rate = 0.0
            plan.rows.append(("patch dropout", "off", "your attention pattern or RoPE needs every token"))
    if is_explicit("trainer.max_epochs", explicit) and not is_explicit("model.warmup_epochs", explicit):
        config.model.warmup_epochs = warmup_epochs(config.trainer.max_epochs or 1)  # 5% of your epochs
    if yours:
        plan.rows.append(("yours (wins)", ", ".join(yours), "set in a config or on the command line"))
    teacher = config.get("model.teacher")
    if teacher:  # vit/training/teacher.py: trained (or read) when fit starts; the ViT's epochs then fit what is left
        share, of = config.get("model.teacher_share"), "the time left" if budget is not None else "max_epochs"
        trained = f"trained first, for {share:.0%} of {of}"
        made = "read from its file" if str(teacher).endswith(".safetensors") else trained
        plan.rows.append(("teacher", f"{teacher}, {made}", "the ViT's epochs fit in the rest; its score alone follows"))
    rank_zero_info(f"plan for {fp.root}:\n{plan.table()}")
    deadline = start + budget if budget is not None else None
    return plan, deadline


def plan_a_start(config, fp, budget: float | None, explicit: set[str], elapsed: Callable[[], float]) -> Plan:
    """The plan when you named no weights: the start the data's kind takes (vit/planning/start.py), the hybrid's
    weights written into `config` where it is chosen and the budget buys it its floor, else from scratch; the
    plan's first row says which and why. `elapsed()`: the seconds of the budget spent so far."""
    init_set = is_explicit("model.init_from", explicit)  # `--model.init_from none` (a value would be weights)
    yours = next(
        (f"--{k}" for k in ("model.arch.stem", "model.stem_from", "model.teacher") if is_explicit(k, explicit)), None
    )
    start = choose_start(fp, forced_off=init_set, yours=yours)
    why = start.why
    if start.source:
        try:
            weights = read_cnn_weights(start.source)
            plan = make_hybrid_plan(
                fp, Machine.here(), budget, elapsed(), arch=weights.arch, source=weights.source, floor=True
            )
        except ValueError as e:  # HybridTooSlow, or weights that cannot be read: the reason goes in the row
            why = f"{start.kind}, but {e}"
        else:
            apply_cnn_weights(config, start.source, explicit)
            plan.rows.insert(0, ("start", f"ImageNet weights: {start.source} (hybrid)", why))
            return plan
    plan = make_plan(fp, Machine.here(), budget_s=budget, elapsed_s=elapsed())
    plan.rows.insert(0, ("start", "from scratch", why))
    return plan


def add_plan_arguments(parser) -> None:
    """vit-train's --plan and --budget."""
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


def plan_yaml(parser, config, max_epochs: int, plan: Plan) -> str:
    """The complete config of this run with the plan's choices written in, `plan: false` and no budget: training
    from it repeats the run without planning."""
    cfg = config.clone()
    cfg.plan, cfg.budget = False, None
    cfg.trainer.max_epochs = max_epochs
    if "config" in cfg:
        del cfg["config"]
    header = "# Planned by vit/planning/plan.py; `vit-train fit --config THIS_FILE` repeats the run without planning.\n"
    header += "".join(f"# {line}\n" for line in plan.table().splitlines())
    return header + parser.dump(cfg, skip_none=False)


def keep_plan_and_budget(trainer: L.Trainer, plan: Plan, deadline: float | None, folder: Path | None, *, yaml_of,
                         budget_owned: bool) -> None:  # fmt: skip
    """Before a planned fit: plan.yaml in `folder` (written again when FitBudget changes the epochs; `yaml_of(epochs)`
    is its text) and, with a deadline and epochs that are the plan's (`budget_owned`), the FitBudget callback, whose
    teardown counts the passes after fit (inside the budget too)."""
    out = Path(folder, "plan.yaml") if folder else None

    def save(max_epochs: int) -> None:
        if trainer.is_global_zero and out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(yaml_of(max_epochs))

    save(trainer.max_epochs)
    if out is not None:
        rank_zero_info(f"plan saved: {out} (vit-train fit --config {out} repeats this run)")
    if deadline is not None and budget_owned:
        teardown_s = FIXED_S / 2 + plan.after_fit_s
        trainer.callbacks.append(FitBudget(deadline, cap=plan.cap, on_change=save, teardown_s=teardown_s))


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
        now, epoch, hp = self.clock(), trainer.current_epoch, pl_module.hparams
        frozen = max(getattr(hp, "freeze_stem_epochs", 0), getattr(hp, "freeze_backbone_epochs", 0))
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
        hp = pl_module.hparams
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
