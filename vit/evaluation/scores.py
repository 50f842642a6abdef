"""Scores of predictions off the training hot path, in one place. During training the same numbers come from
vit/training/metrics.py, counted on the device without a host read; here torchmetrics' functional metrics do the
counting where it has them. torchmetrics is imported where it counts: importing it pulls in scipy.signal, 1.1 s of
the 4.8 s `vit-predict` took to start, which needs only the temperature (vit/evaluation/calibration.py)."""

import torch


def balanced_accuracy(pred: torch.Tensor, true: torch.Tensor, num_classes: int) -> float:
    """The mean recall over the classes that have images (scikit-learn's balanced_accuracy_score)."""
    from torchmetrics.functional.classification import multiclass_confusion_matrix

    cm = multiclass_confusion_matrix(pred, true, num_classes)
    support = cm.sum(dim=1)
    return float((cm.diag()[support > 0].double() / support[support > 0]).mean())


ECE_BINS = 15


def top1_ece(confidence: torch.Tensor, correct: torch.Tensor) -> float:
    """Expected calibration error of the top-1 predictions: 15 equal-width bins of `confidence` (the probability
    given to the predicted class), L1 gap to the accuracy in each, weighted by its count (torchmetrics'
    binary_calibration_error on (confidence, correct); the same as its multiclass_calibration_error of the softmax)."""
    from torchmetrics.functional.classification import binary_calibration_error

    return float(binary_calibration_error(confidence, correct.long(), n_bins=ECE_BINS))
