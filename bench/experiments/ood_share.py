"""Can a choice of score call half of every far kind unknown at the stored thresholds? ood_protocol.py's candidates,
with the share each calls unknown (per-class split-conformal thresholds from the validation images, as fit stores
them) as a second target beside the AUROC, read from ood_protocol.py's cache (no model is run):

    python bench/experiments/ood_share.py OUT.json.cache.pt

Prints the choice over the far kinds with both targets (AUROC >= 0.90, share >= 0.50), leave-one-kind-out, and the
candidates that call the most of the hardest far kind unknown (the lower share of its models) with their worst
margin over every other far (model, kind).
"""

import argparse
import sys
from pathlib import Path

import torch

from vit.evaluation.unknown import class_thresholds, reject_threshold, thresholds_of

sys.path.insert(0, str(Path(__file__).parent))
from ood_protocol import FAR_TARGET, aurocs, base_scores, with_fusions  # noqa: E402

SHARE_TARGET = 0.5


def shares(entry: dict, scores: dict) -> dict[str, dict[str, float]]:
    """{kind: {candidate: share of the kind below the candidate's stored threshold}} for one model."""
    out, pred = entry["outputs"], entry["outputs"]["val"][1].argmax(-1)
    found = {}
    for c, val in scores["val"].items():
        record = {
            "threshold": reject_threshold(val),
            "class_thresholds": class_thresholds(val, pred, len(entry["classes"])),
        }
        for kind, by in scores.items():
            if kind not in ("val", "test"):
                below = by[c] < thresholds_of(record, out[kind][1])
                found.setdefault(kind, {})[c] = float(below.double().mean())
    return found


def far_margins(table: dict, share: dict, c: str, leave_out: str | None) -> list[float]:
    """Every far (model, kind) margin of candidate c over both targets, but the kind left out."""
    return [
        value[c] - target
        for source, target in ((table, FAR_TARGET), (share, SHARE_TARGET))
        for kinds in source.values()
        for kind, value in kinds.items()
        if kind not in ("near", leave_out)
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cache", help="ood_protocol.py's OUT.json.cache.pt")
    args = ap.parse_args()
    entries = torch.load(args.cache, weights_only=False)  # our own cache of tensors and dicts
    scores = {name: with_fusions(base_scores(e)) for name, e in entries.items()}
    table = {name: aurocs(s) for name, s in scores.items()}
    share = {name: shares(e, scores[name]) for name, e in entries.items()}
    candidates = list(next(iter(table.values()))["blur"])
    kinds = sorted({k for t in table.values() for k in t if k != "near"})
    for leave_out in [None, *kinds]:
        best = max(candidates, key=lambda c: min(far_margins(table, share, c, leave_out)))
        shown = (
            ""
            if leave_out is None
            else "  ".join(
                f"{m} {table[m][leave_out][best]:.3f} / {100 * share[m][leave_out][best]:.0f}%"
                for m in table
                if leave_out in table[m]
            )
        )
        print(
            f"without {leave_out or 'nothing':9s}: {best:42s} worst far margin {min(far_margins(table, share, best, leave_out)):+.3f}  {shown}"
        )
    hardest = min(kinds, key=lambda k: max(min(share[m][k][c] for m in share if k in share[m]) for c in candidates))
    models = [m for m in share if hardest in share[m]]
    print(f"the most of '{hardest}' called unknown (models {', '.join(models)}):")
    for c in sorted(candidates, key=lambda c: -min(share[m][hardest][c] for m in models))[:5]:
        others = min(far_margins(table, share, c, hardest))
        print(
            f"  {c:42s} "
            + " / ".join(f"{100 * share[m][hardest][c]:.0f}%" for m in models)
            + f"; elsewhere {others:+.3f}"
        )


if __name__ == "__main__":
    main()
