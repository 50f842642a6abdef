"""Scores of predictions off the training hot path, in one place. During training the same numbers come from
vit/training/metrics.py, counted on the device without a host read; here torchmetrics' functional metrics do the
counting where it has them."""

import torch
from torchmetrics.functional.classification import multiclass_confusion_matrix


def balanced_accuracy(pred: torch.Tensor, true: torch.Tensor, num_classes: int) -> float:
    """The mean recall over the classes that have images (scikit-learn's balanced_accuracy_score)."""
    cm = multiclass_confusion_matrix(pred, true, num_classes)
    support = cm.sum(dim=1)
    return float((cm.diag()[support > 0].double() / support[support > 0]).mean())
