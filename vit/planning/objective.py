"""What a planned run optimises: accuracy, or balanced accuracy (each class counted alike), `--objective`.

    plan = with_objective(plan, fp, "accuracy")   # the plan's checkpoint and logit rules for that score

`auto` (the default) is the long-tail rule of vit/planning/plan.py: balanced accuracy below a class balance of
LONG_TAIL_BALANCE (the best checkpoint by `val/acc_balanced`, the logits shifted for the training prior where
validation shows a gain beyond noise), accuracy above it. Balanced accuracy lifts the rare classes and costs the
common ones: on a folder whose held-out images are as imbalanced as its training images, accuracy can end below the
majority class's share. Say which score matters to you; the plan's `objective` row says which it follows and why.
"""

from __future__ import annotations

from vit.planning.fingerprint import Fingerprint
from vit.planning.plan import Plan
from vit.planning.rules import LONG_TAIL_BALANCE

OBJECTIVES = ("auto", "accuracy", "balanced")
BALANCED_RULE = "best checkpoint by val/acc_balanced, then post-hoc logit adjustment (tau from val, if beyond noise)"
ACCURACY_RULE = "best checkpoint by val/acc, the logits as trained"


def with_objective(plan: Plan, fp: Fingerprint, objective: str = "auto") -> Plan:
    """`plan` (changed in place and returned) following `objective`: its checkpoint monitor and post-hoc logit
    adjustment, and an `objective` row in place of the `long tail` row. Multi-label plans keep val/mAP."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective={objective!r} must be one of {', '.join(OBJECTIVES)}")
    if fp.task == "multilabel":
        return plan
    long_tail = fp.balance < LONG_TAIL_BALANCE
    balanced = objective == "balanced" or (objective == "auto" and long_tail)
    plan.overrides.pop("model.posthoc_logit_adjust", None)
    plan.overrides.pop("checkpoint.monitor", None)
    if balanced:
        plan.overrides["model.posthoc_logit_adjust"] = True
        plan.overrides["checkpoint.monitor"] = "val/acc_balanced"
    compared = f"class balance {fp.balance:.2f} {'<' if long_tail else '>='} {LONG_TAIL_BALANCE}"
    why = f"{compared} (docs/recipes.md)" if objective == "auto" else f"--objective {objective}; {compared}"
    score = f"balanced accuracy: {BALANCED_RULE}" if balanced else f"accuracy: {ACCURACY_RULE}"
    row = ("objective", score, why)
    rows = [r for r in plan.rows if r[0] != "long tail"]
    at = next((i for i, r in enumerate(rows) if r[0] == "estimate"), len(rows))
    plan.rows = [*rows[:at], row, *rows[at:]]
    return plan
