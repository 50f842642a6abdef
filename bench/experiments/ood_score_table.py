"""One score on every model of ood_protocol.py's cache: each kind's AUROC and the share its stored thresholds call
unknown, and the most validation images any class loses; no model is run. For comparing models trained two ways (the
same protocol run on each set of checkpoints) under the score the product applies.

    python bench/experiments/ood_score_table.py OUT.json.cache.pt [--score block_mahalanobis+input+mahalanobis]

Prints a line a model: its top-1 on its test images, `kind AUROC/share%` for every outlier kind, then the worst
class's loss on validation.
"""

import argparse
import sys
from pathlib import Path

import torch

from vit.evaluation.unknown import DEFAULT_SCORE

sys.path.insert(0, str(Path(__file__).parent))
from ood_protocol import aurocs, base_scores, rejection, with_fusions  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cache")
    ap.add_argument("--score", default=DEFAULT_SCORE)
    a = ap.parse_args()
    for name, entry in torch.load(a.cache, weights_only=False).items():
        table = aurocs(with_fusions(base_scores(entry)))
        r = rejection(entry, a.score)
        logits, targets = entry["outputs"]["test"][1], entry["outputs"]["test"][3]
        top1 = 100 * float((logits.argmax(-1) == targets).double().mean())
        kinds = " ".join(f"{k} {table[k][a.score]:.3f}/{100 * r['unknown_share'][k]:.0f}%" for k in table)
        print(
            f"{name:12s} test {top1:.1f}% | {kinds} | worst class on validation {100 * max(r['val_lost_per_class'].values()):.1f}%"
        )


if __name__ == "__main__":
    main()
