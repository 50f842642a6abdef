"""Top-k accuracy as a torchmetrics Metric that leaves out padding targets without reading the host.

torchmetrics' `MulticlassAccuracy(ignore_index=...)` drops ignored targets by boolean-mask assignment
(`target[target == ignore_index] = ...`, `stat_scores.py`): a `nonzero`, so a host read, at every update, and its
`one_hot` checks bounds on the host on CPUs. Under DDP the in-memory path pads the validation set with targets of
`vit.data.device.IGNORE` so that every rank has the same batches (vit/data/device.py); this metric counts only the
others, with two sums that torchmetrics all-reduces across ranks at `compute()` as any of its metrics.
"""

import torch
from torchmetrics import Metric

from vit.data.device import IGNORE


class TopKAccuracy(Metric):
    """Share of targets (those != IGNORE) among the top_k logits: micro-averaged, as MulticlassAccuracy's micro."""

    full_state_update = False
    higher_is_better = True

    def __init__(self, top_k: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.top_k = top_k
        self.add_state("correct", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, target: torch.Tensor) -> None:
        """logits (B, C), target (B,) class indices or IGNORE."""
        counted = target != IGNORE
        top = logits.topk(min(self.top_k, logits.shape[-1]), dim=-1).indices  # (B, k)
        hit = (top == target[:, None]).any(dim=-1) & counted
        self.correct += hit.sum()
        self.total += counted.sum()

    def compute(self) -> torch.Tensor:
        return self.correct.float() / self.total.clamp(min=1)


class ConfusionCounts(Metric):
    """The (C, C) confusion matrix of argmax predictions (rows: true class), IGNORE targets left out, counted with one
    `index_add_` into a fixed-size state: torchmetrics' MulticlassConfusionMatrix counts with `bincount`, whose output
    size depends on the data (a host read on a GPU), and drops ignored targets by boolean indexing (another).
    `compute()` gives (balanced accuracy, macro F1), as scikit-learn's `balanced_accuracy_score` and
    `f1_score(average="macro")`: over the classes that occur among the targets or the predictions."""

    full_state_update = False
    higher_is_better = True

    def __init__(self, num_classes: int, **kwargs):
        super().__init__(**kwargs)
        self.num_classes = num_classes
        self.add_state("counts", default=torch.zeros(num_classes * num_classes, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, target: torch.Tensor) -> None:
        """logits (B, C), target (B,) class indices or IGNORE."""
        counted = target != IGNORE
        cell = target.clamp(min=0) * self.num_classes + logits.argmax(dim=-1)  # (B,) row-major cell of each image
        self.counts.index_add_(0, cell, counted.long())

    def matrix(self) -> torch.Tensor:
        return self.counts.view(self.num_classes, self.num_classes)

    def compute(self) -> tuple[torch.Tensor, torch.Tensor]:
        cm = self.matrix().double()
        tp, support, predicted = cm.diag(), cm.sum(dim=1), cm.sum(dim=0)
        present = support > 0
        recall = tp / support.clamp(min=1)
        balanced = recall[present].mean() if present.any() else recall.new_zeros(())
        f1 = 2 * tp / (support + predicted).clamp(min=1)  # = 2PR / (P + R), 0 where a class is never right
        seen = present | (predicted > 0)
        f1_macro = f1[seen].mean() if seen.any() else f1.new_zeros(())
        return balanced.float(), f1_macro.float()


def expert_usage_histograms(experiment, counts: torch.Tensor, step: int) -> None:
    """A TensorBoard histogram per MoE block, moe/expert_usage/layer_i, of its (blocks, E) token counts."""
    experts = torch.arange(counts.shape[1])
    for i, layer in enumerate(counts):
        if layer.sum():
            experiment.add_histogram(
                f"moe/expert_usage/layer_{i}", experts.repeat_interleave(layer), step, bins=len(experts)
            )
