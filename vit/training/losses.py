"""The training loss, term by term, in one object: what a step's targets are (timm's Mixup/CutMix on the batch), the
classification term (cross-entropy with label smoothing, plus the logit adjustment's tau * log(prior); binary
cross-entropy for several labels an image), DeiT's hard distillation from a teacher, and the weighted auxiliary
terms (DRLoc, locality guidance, the experts' load balancing).

    losses = LossTerms(num_classes=10, label_smoothing=0.1, mixup_alpha=0.8, cutmix_alpha=1.0)
    x, target, mixed = losses.mix(x, y)                   # before the forward
    loss = losses(logits, target, mixed=mixed, distill=distill, aux=aux)
"""

import torch
import torch.nn.functional as F
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy

from vit.training.mixing import mix_soft
from vit.training.multilabel import multilabel_loss
from vit.training.teacher import hard_distillation


class LossTerms:
    """The loss of a training step. `log_prior` (C,) is tau * log(the training set's class shares) once
    `set_prior` has read them (Menon et al. 2021: the training logits see it, predictions do not); None: off."""

    def __init__(
        self,
        *,
        num_classes: int,
        task: str = "multiclass",
        label_smoothing: float = 0.1,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        mixup_prob: float = 1.0,
        distill_weight: float = 0.5,
        moe_aux_weight: float = 0.01,
    ):
        self.multilabel = task == "multilabel"
        self.label_smoothing, self.distill_weight, self.moe_aux_weight = label_smoothing, distill_weight, moe_aux_weight
        self.mixup = None  # timm's Mixup/CutMix on the batch, and the loss of its soft targets
        if mixup_alpha > 0 or cutmix_alpha > 0:
            self.mixup = Mixup(
                mixup_alpha=mixup_alpha,
                cutmix_alpha=cutmix_alpha,
                prob=mixup_prob,
                label_smoothing=label_smoothing,
                num_classes=num_classes,
            )
            self.soft_ce = SoftTargetCrossEntropy()
        self.log_prior: torch.Tensor | None = None

    def set_prior(self, counts: list[int], tau: float, device: torch.device) -> None:
        """The logit adjustment's (C,) tau * log(class shares) from the training set's class counts."""
        shares = torch.tensor(counts, dtype=torch.float32).clamp(min=1)
        self.log_prior = (tau * (shares / shares.sum()).log()).to(device)

    def mix(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """The batch the model sees, its targets, and whether they were mixed: timm's Mixup/CutMix pairs images,
        so only an even batch is mixed; targets that are already probabilities (B, C) are mixed alike."""
        if self.mixup is None or len(x) % 2:
            return x, y, False
        x, y = mix_soft(self.mixup, x, y) if y.is_floating_point() else self.mixup(x, y)
        return x, y, True

    def __call__(
        self,
        logits: torch.Tensor,
        target: torch.Tensor,
        *,
        mixed: bool = False,
        distill: tuple | None = None,
        aux: torch.Tensor | float = 0.0,
        moe_aux: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """logits (B, C); target: class indices (B,), or (B, C) probabilities or labels; `distill` (the student's
        logits that distil, the teacher's) from the forward; `aux` the weighted auxiliary losses; `moe_aux` the
        experts' load-balancing loss (weighted here by moe_aux_weight)."""
        loss = self.classification(logits, target, mixed=mixed, distill=distill) + aux
        return loss if moe_aux is None else loss + self.moe_aux_weight * moe_aux

    def classification(self, logits: torch.Tensor, target: torch.Tensor, *, mixed: bool, distill) -> torch.Tensor:
        prior = self.log_prior if self.log_prior is not None else 0.0
        if self.multilabel and not mixed:
            return multilabel_loss(logits, target)
        if mixed:
            loss = multilabel_loss(logits, target) if self.multilabel else self.soft_ce(logits + prior, target)
        else:  # cross_entropy takes class indices or probabilities alike (label smoothing applies to both)
            loss = F.cross_entropy(logits + prior, target, label_smoothing=self.label_smoothing)
        return hard_distillation(loss, distill, self.distill_weight)
