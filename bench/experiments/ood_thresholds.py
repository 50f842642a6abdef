"""Per-class thresholds set on every validation image predicted as the class (what fit stores) or only on those the
model classifies correctly (rejecting its errors more often), under one score (the default unless --score), from
ood_protocol.py's cache (no model is run):

    python bench/experiments/ood_thresholds.py OUT.json.cache.pt [--score block_mahalanobis+input+mahalanobis]

Prints a line per model and rule: the share of each outlier kind called unknown, and the most images any class of
50+ loses on validation and on the test images.
"""

import argparse
import sys
from pathlib import Path

import torch

from vit.evaluation.unknown import DEFAULT_SCORE, MIN_CLASS_IMAGES, class_thresholds, reject_threshold, thresholds_of

sys.path.insert(0, str(Path(__file__).parent))
from ood_protocol import base_scores, with_fusions  # noqa: E402


def worst_class_loss(score: torch.Tensor, record: dict, logits: torch.Tensor, targets: torch.Tensor) -> float:
    """The largest share of one class's images (classes with MIN_CLASS_IMAGES or more) called unknown."""
    lost = score < thresholds_of(record, logits)
    return max(float(lost[targets == c].double().mean()) for c in targets.unique() if (targets == c).sum() >= MIN_CLASS_IMAGES)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cache")
    ap.add_argument("--score", default=DEFAULT_SCORE)
    a = ap.parse_args()
    for name, entry in torch.load(a.cache, weights_only=False).items():
        scores, out = with_fusions(base_scores(entry)), entry["outputs"]
        val, predicted, targets = scores["val"][a.score], out["val"][1].argmax(-1), out["val"][3]
        for rule, keep in (
            ("predicted", torch.ones_like(targets, dtype=torch.bool)),
            ("correct", predicted == targets),
        ):
            record = {"threshold": reject_threshold(val[keep]),
                      "class_thresholds": class_thresholds(val[keep], predicted[keep], len(entry["classes"]))}  # fmt: skip
            kinds = " ".join(
                f"{k} {100 * float((s[a.score] < thresholds_of(record, out[k][1])).double().mean()):.0f}%"
                for k, s in scores.items()
                if k not in ("val", "test")
            )
            lost = [worst_class_loss(scores[s][a.score], record, out[s][1], out[s][3]) for s in ("val", "test")]
            print(
                f"{name:12s} {rule:9s} {kinds} | worst class: validation {100 * lost[0]:.1f}%, test {100 * lost[1]:.1f}%"
            )


if __name__ == "__main__":
    main()
