"""Top-k accuracy as a torchmetrics Metric that leaves out padding targets without reading the host.

torchmetrics' `MulticlassAccuracy(ignore_index=...)` drops ignored targets by boolean-mask assignment
(`target[target == ignore_index] = ...`, `stat_scores.py`): a `nonzero`, so a host read, at every update, and its
`one_hot` checks bounds on the host on CPUs. Under DDP the in-memory path pads the validation set with targets of
`vit.device_data.IGNORE` so that every rank has the same batches (vit/device_data.py); this metric counts only the
others, with two sums that torchmetrics all-reduces across ranks at `compute()` as any of its metrics.
"""

import torch
from torchmetrics import Metric

from vit.device_data import IGNORE


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
