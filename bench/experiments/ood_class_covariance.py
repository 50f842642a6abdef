"""A candidate the product does not have yet: each class's own covariance (a class-conditional Gaussian, as in
quadratic discriminant analysis) in place of the shared one, on ood_protocol.py's cached outputs; the training
features are recomputed from each checkpoint (the cache keeps the validation, test and outlier ones):

    python bench/experiments/ood_class_covariance.py OUT.json.cache.pt NAME=CKPT [NAME=CKPT ...]

Two base scores join the protocol's nine: `qda`, minus the head's features' smallest over the classes of the squared
Mahalanobis distance under the class's own covariance plus the log-determinant of that covariance (the negative
log-density up to constants), and `block_qda`, the same after every block, each standardised on the validation images
and summed (as `block_mahalanobis`). Every sum of two or three is a candidate, and the choice is the protocol's (the
largest worst AUROC margin, leaving one kind out); printed: the choice per kind left out, with each model's AUROC and
the share its per-class thresholds call unknown, then the default's and the new candidate's figures side by side
with the most validation images any class loses.
Covariances are inverted on the directions above RCOND of the largest variance, as unknown.py does.
"""

import argparse
import itertools
import sys
from pathlib import Path

import torch

from vit.deployment.labelled import training_data
from vit.evaluation.unknown import DEFAULT_SCORE, RCOND, class_thresholds, fused_score, fusion_of, reject_threshold
from vit.model.checkpoint import load_checkpoint, model_of

sys.path.insert(0, str(Path(__file__).parent))
from ood_protocol import aurocs, base_scores, choose, outputs_of  # noqa: E402
from ood_share import shares  # noqa: E402
from ood_thresholds import worst_class_loss  # noqa: E402

CANDIDATE = "block_qda+input+qda"


def class_gaussians(feats: torch.Tensor, targets: torch.Tensor, num_classes: int) -> list:
    """Training features (N, L + 1, D) -> per layer, per class: (mean (D,), precision (D, D), log-determinant)."""
    layers = []
    for i in range(feats.shape[1]):
        x, per_class = feats[:, i].double(), []
        for c in range(num_classes):
            z = x[targets == c]
            mean = z.mean(0)
            w, v = torch.linalg.eigh((z - mean).T @ (z - mean) / len(z))
            kept = w > RCOND * w.max()
            per_class.append((mean, (v[:, kept] / w[kept]) @ v[:, kept].T, w[kept].log().sum()))
        layers.append(per_class)
    return layers


def distances(feats: torch.Tensor, gaussians: list) -> torch.Tensor:
    """(N, L + 1, D) -> (N, L + 1): each layer's smallest over the classes of distance plus log-determinant."""
    out = []
    for i, per_class in enumerate(gaussians):
        x = feats[:, i].double()
        d = [((x - m) @ p * (x - m)).sum(-1) + logdet for m, p, logdet in per_class]
        out.append(torch.stack(d, -1).amin(-1))
    return torch.stack(out, -1)


def with_class_covariance(entry: dict, ckpt_path: str) -> dict:
    """The protocol's base scores of one model with `qda` and `block_qda` added, on every set."""
    ckpt = load_checkpoint(ckpt_path)
    model, hparams = model_of(ckpt, ckpt_path)
    files, labels = zip(*training_data(ckpt_path, ckpt, hparams).samples["train"])
    gaussians = class_gaussians(outputs_of(model, hparams, list(files))[0], torch.tensor(labels), len(entry["classes"]))
    scores = base_scores(entry)
    val = distances(entry["outputs"]["val"][0], gaussians)
    center, spread = val.mean(0), val.std(0).clamp_min(1e-12)
    for name, out in entry["outputs"].items():
        z = (distances(out[0], gaussians) - center) / spread  # (N, L + 1), standardised on validation
        scores[name]["block_qda"], scores[name]["qda"] = -z[:, :-1].sum(-1).float(), -z[:, -1].float()
    return scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cache")
    ap.add_argument("models", nargs="+", metavar="NAME=CKPT", help="the checkpoint of every model in the cache")
    a = ap.parse_args()
    entries = torch.load(a.cache, weights_only=False)  # our own cache of tensors and dicts
    table, share, lost = {}, {}, {}
    for name, ckpt_path in (m.split("=", 1) for m in a.models):
        base = with_class_covariance(entries[name], ckpt_path)
        names = ["+".join(p) for n in (2, 3) for p in itertools.combinations(sorted(base["val"]), n)]
        fusions = {n: fusion_of(base["val"], n) for n in names}
        scores = {s: {**by, **{n: fused_score(by, n, f) for n, f in fusions.items()}} for s, by in base.items()}
        table[name], share[name] = aurocs(scores), shares(entries[name], scores)
        out = entries[name]["outputs"]
        for c in (DEFAULT_SCORE, CANDIDATE):  # the most any class loses to its per-class threshold, on validation
            val, predicted = scores["val"][c], out["val"][1].argmax(-1)
            record = {"threshold": reject_threshold(val),
                      "class_thresholds": class_thresholds(val, predicted, len(entries[name]["classes"]))}  # fmt: skip
            lost[name, c] = worst_class_loss(val, record, out["val"][1], out["val"][3])
        print(f"{name}: scored", flush=True)
    kinds = sorted({k for t in table.values() for k in t})
    for leave in [None, *kinds]:
        best, margin = choose(table, leave)
        shown = "  ".join(f"{m} {table[m][leave][best]:.3f}/{100 * share[m][leave][best]:.0f}%"
                          for m in table if leave in table[m]) if leave else ""  # fmt: skip
        print(f"without {leave or 'nothing':9s}: {best:40s} worst margin {margin:+.3f}  {shown}")
    for c in (DEFAULT_SCORE, CANDIDATE):
        print(f"{c}:")
        for m in table:
            kinds = " ".join(f"{k} {table[m][k][c]:.3f}/{100 * share[m][k][c]:.0f}%" for k in table[m])
            print(f"  {m:12s} {kinds} | worst class on validation {100 * lost[m, c]:.1f}%")


if __name__ == "__main__":
    main()
