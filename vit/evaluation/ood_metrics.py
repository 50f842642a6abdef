"""How well "unknown" works on a labelled set: the AUROC and false-positive rate of a score against other images, what a
checkpoint's thresholds reject (vit-eval's report and --ood), and the tap that keeps a pass's features for them.

    auroc(inside, outside), fpr_at_tpr(inside, outside)   # scores of the labelled images against others'
    rejection_report(logits, feats, inputs, targets, record, classes)
"""

import torch

from vit.evaluation.image_features import input_statistics, pooled_features
from vit.evaluation.unknown import ACCEPT, Rejector, accept_threshold, thresholds_of


def auroc(inside: torch.Tensor, outside: torch.Tensor) -> float:
    """Area under the ROC curve of telling `inside` (positive) from `outside` images by the score."""
    from torchmetrics.functional.classification import binary_auroc  # here: vit-predict starts without it (scores.py)

    scores = torch.cat([inside, outside]).double()
    # torchmetrics takes scores outside [0, 1] for logits and applies a sigmoid, which in float64 rounds every score
    # above ~37 to 1 and below ~-745 to 0: distances of hundreds tied, and the AUROC fell to 0.5. Their ranks scaled
    # into [0, 1] keep order and ties (an infinite score too), and the area depends on nothing else.
    _, rank = torch.unique(scores, return_inverse=True)
    scores = rank.double() / max(1, int(rank.max()))
    labels = torch.cat([torch.ones(len(inside)), torch.zeros(len(outside))]).long()
    return float(binary_auroc(scores, labels))


def fpr_at_tpr(inside: torch.Tensor, outside: torch.Tensor, tpr: float = ACCEPT) -> float:
    """The share of `outside` images accepted at the threshold that accepts `tpr` of the `inside` ones."""
    return float((outside >= accept_threshold(inside, tpr)).double().mean())


def rejection_report(
    logits: torch.Tensor,
    feats: torch.Tensor | None,
    inputs: torch.Tensor | None,
    targets: torch.Tensor,
    record: dict | None,
    classes: list[str],
) -> dict | None:
    """What a checkpoint's rejection does to a labelled set: the share rejected, overall and per class, and the
    accuracy on the images it accepts; None without a rejection record."""
    if record is None:
        return None
    unknown = Rejector(record)(logits, feats, inputs)
    correct = logits.argmax(-1).cpu() == targets.cpu()
    accepted = ~unknown
    per_class = {
        name: float(unknown[targets == c].double().mean()) if (targets == c).any() else None
        for c, name in enumerate(classes)
    }
    return {
        "score": record["score"],
        "threshold": record["threshold"],
        "rejected": float(unknown.double().mean()),
        "rejected_per_class": per_class,
        "accuracy_accepted": float(correct[accepted].double().mean()) if accepted.any() else None,
        "accuracy_all": float(correct.double().mean()),
    }


def ood_report(inside: dict, outside: dict, record: dict | None, outside_logits: torch.Tensor) -> dict:
    """Every score's AUROC and FPR at 95% TPR for telling `inside` ({score: (N,)}, the labelled set) from `outside`
    (a folder of other images, whose logits are `outside_logits`), and the share of `outside` the checkpoint's own
    thresholds call unknown."""
    report = {
        name: {"auroc": auroc(inside[name], outside[name]), "fpr_at_95_tpr": fpr_at_tpr(inside[name], outside[name])}
        for name in inside
        if name in outside
    }
    if record is not None and record["score"] in outside:
        unknown = outside[record["score"]] < thresholds_of(record, outside_logits)
        report["rejected_by_the_checkpoint"] = float(unknown.double().mean())
    return report


class FeatureTap(torch.nn.Module):
    """Called like the model (images -> logits), keeping the pooled features and input_statistics of every call on the
    CPU: one pass over a set gives the logits to a scorer (vit.evaluation.report.score) and the rest to rejection."""

    def __init__(self, model):
        super().__init__()
        self.model, self.feats, self.inputs = model, [], []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats, logits = pooled_features(self.model, x)
        self.feats.append(feats.float().cpu())
        self.inputs.append(input_statistics(x).cpu())
        return logits
