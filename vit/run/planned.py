"""A planned training run: vit/planning/plan.py's recipe applied to the parsed config, kept inside its time budget, and
saved.

    vit-train fit --data.root PATH                   # configs/folder.yaml: plan: true
    vit-train fit --data.root PATH --budget 5min     # model and epochs chosen to finish in 5 minutes, start to exit
    vit-train --budget 30min                         # CIFAR-10 (configs/cifar10.yaml's data, a planned recipe)
    vit-train --config configs/mnist.yaml --data.init_args.dataset torch/fashion_mnist --budget 5min

vit/run/steps.py calls `apply_plan` before anything is built (a folder is decoded once, at the planned size),
then `keep_plan_and_budget`, which adds the `FitBudget` callback and writes <run>/plan.yaml: the complete config,
`plan: false`, so that `vit-train fit --config <run>/plan.yaml` trains the same run again without planning.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from vit.data.sources import source_for
from vit.model.cnn_weights import CnnWeights, read_cnn_weights
from vit.model.config import follows_patch_grid
from vit.model.pretrained import Pretrained
from vit.planning.budget import parse_budget, process_start
from vit.planning.explicit import explicit_keys, is_explicit
from vit.planning.fine_tune_plan import make_fine_tune_plan
from vit.planning.fingerprint import fingerprint
from vit.planning.hybrid_plan import make_hybrid_plan
from vit.planning.objective import with_objective
from vit.planning.plan import Plan, make_plan
from vit.planning.rules import FIXED_S, warmup_epochs
from vit.planning.speed import Machine
from vit.planning.start import choose_start
from vit.run.fit_budget import FitBudget
from vit.run.weights import apply_cnn_weights


def apply_plan(
    config,
    argv: Sequence[str],
    clock: Callable[[], float] = time.time,
    weights: Pretrained | CnnWeights | None = None,
    precision: str | None = None,
) -> tuple[Plan, float | None] | None:
    """Plan when `config.plan` or `--budget` asks for it: fingerprint the data (any source of vit/data/sources.py),
    calibrate, write the plan's values into `config` (a jsonargparse Namespace of `fit`) wherever the user did not
    set the key. With `weights` (read by vit/run/weights.py, which put their model into the config) the plan
    is a fine-tune of that model (vit/planning/fine_tune_plan.py); `precision`, one you set, is the one it times.
    Returns (the plan, the deadline as a `clock` time) or None when not planning. Raises ValueError with one line
    when it cannot plan."""
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
    at = {"precision": precision}  # one you set: it wins, so the plan times it
    if isinstance(weights, CnnWeights):  # a CNN's ImageNet weights: the hybrid (vit/planning/hybrid_plan.py)
        plan = make_hybrid_plan(
            fp, Machine.here(), budget, clock() - start, arch=weights.arch, source=weights.source, **at
        )
    elif weights is not None:
        arch = {**config.model.arch.as_dict(), "img_size": weights.arch["img_size"]}  # their own resolution
        source = weights.source
        plan = make_fine_tune_plan(fp, Machine.here(), budget, clock() - start, arch=arch, source=source, **at)
    else:
        plan = plan_a_start(config, fp, budget, explicit, lambda: clock() - start, **at)
    plan = with_objective(plan, fp, config.get("objective") or "auto")
    yours = {}
    for key, value in plan.overrides.items():
        if is_explicit(key, explicit):
            yours[key] = config.get(key)
        else:
            config[key] = tuple(value) if isinstance(value, list) else value
    if config.get("model.arch.patch_drop_rate") and not is_explicit("model.arch.patch_drop_rate", explicit):
        arch = config.model.arch
        if follows_patch_grid(arch.get("attn_pattern", "global"), arch.get("rope"), arch.get("pos_embed")):
            # your attention follows the patch grid (the model refuses PatchDropout there): train every token
            config.model.arch.patch_drop_rate = 0.0
            plan.rows.append(("patch dropout", "off", "your attention pattern or RoPE needs every token"))
    follows = {}  # planned values that follow yours
    if is_explicit("trainer.max_epochs", explicit) and not is_explicit("model.warmup_epochs", explicit):
        config.model.warmup_epochs = warmup_epochs(config.trainer.max_epochs or 1)  # 5% of your epochs
        follows["model.warmup_epochs"] = config.model.warmup_epochs
    plan.mark_yours(yours, follows)
    teacher = config.get("model.teacher")
    if teacher:  # vit/training/teacher.py: trained (or read) when fit starts; the ViT's epochs then fit what is left
        share, of = config.get("model.teacher_share"), "the time left" if budget is not None else "max_epochs"
        trained = f"trained first, for {share:.0%} of {of}"
        made = "read from its file" if str(teacher).endswith(".safetensors") else trained
        plan.rows.append(("teacher", f"{teacher}, {made}", "the ViT's epochs fit in the rest; its score alone follows"))
    rank_zero_info(f"plan for {fp.root}:\n{plan.table()}")
    deadline = start + budget if budget is not None else None
    return plan, deadline


def plan_a_start(
    config, fp, budget: float | None, explicit: set[str], elapsed: Callable[[], float], precision: str | None = None
) -> Plan:
    """The plan when you named no weights: the start the data's kind takes (vit/planning/start.py), the hybrid's
    weights written into `config` where it is chosen and the budget buys it its floor, else from scratch; the
    plan's first row says which and why. `elapsed()`: the seconds of the budget spent so far; `precision`: yours."""
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
                fp,
                Machine.here(),
                budget,
                elapsed(),
                arch=weights.arch,
                source=weights.source,
                floor=True,
                precision=precision,
            )
        except ValueError as e:  # HybridTooSlow, or weights that cannot be read: the reason goes in the row
            why = f"{start.kind}, but {e}"
        else:
            apply_cnn_weights(config, start.source, explicit)
            plan.rows.insert(0, ("start", f"ImageNet weights: {start.source} (hybrid)", why))
            return plan
    plan = make_plan(fp, Machine.here(), budget_s=budget, elapsed_s=elapsed(), precision=precision)
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
        "--objective",
        type=Literal["auto", "accuracy", "balanced"],
        default="auto",
        help="what a planned run optimises: accuracy, or balanced accuracy (each class alike: the best checkpoint by "
        "val/acc_balanced and logits shifted for the training prior); auto: balanced below a class balance of 0.5",
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


def keep_plan_and_budget(
    trainer: L.Trainer, plan: Plan, deadline: float | None, folder: Path | None, *, yaml_of, budget_owned: bool
) -> None:
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
