"""Several labels an image (data.task "multilabel"): a sigmoid per label trained with binary cross-entropy, and the
metrics that fit, counted on the device: macro mAP (the ranking of each label's scores, whatever the threshold),
and macro and micro F1 at 0.5 (per-label thresholds are chosen on the validation set after fit:
vit/evaluation/multilabel.py). Targets are (B, C) 0/1 floats; the in-memory path's DDP padding rows are IGNORE."""

import torch
import torch.nn.functional as F
from torchmetrics import MetricCollection
from torchmetrics.classification import MultilabelAveragePrecision, MultilabelF1Score

from vit.data.device import IGNORE


def multilabel_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of (B, C) logits against (B, C) targets in [0, 1], padding rows (IGNORE) left out."""
    keep = (targets != IGNORE).to(logits.dtype)  # (B, C): 0 on padding rows
    loss = F.binary_cross_entropy_with_logits(logits, targets.clamp(min=0), weight=keep, reduction="sum")
    return loss / keep.sum().clamp(min=1)


def multilabel_metrics(num_labels: int) -> MetricCollection:
    """mAP, f1_macro and f1_micro of (B, C) logits against (B, C) 0/1 targets. validate_args=False: torchmetrics'
    checks read the tensors on the host (a sync per batch on a GPU)."""
    common = dict(num_labels=num_labels, ignore_index=IGNORE, validate_args=False)
    return MetricCollection(
        {
            "mAP": MultilabelAveragePrecision(average="macro", thresholds=None, **common),
            "f1_macro": MultilabelF1Score(average="macro", **common),
            "f1_micro": MultilabelF1Score(average="micro", **common),
        }
    )
