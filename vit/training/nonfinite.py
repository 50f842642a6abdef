"""Non-finite losses and gradients, handled without reading a value on the host at every step.

`if not torch.isfinite(loss)` in a training step makes the host wait for the device (a synchronisation per step on
GPU). Instead the decision stays on the device, as under torch's GradScaler: before each optimizer step the guard
checks every micro-batch's loss and the total norm of the gradients (all-reduced under DDP, so every rank decides the
same; the norm is the one gradient clipping uses, torch.nn.utils.get_total_norm) and sets
the optimizer's `found_inf`, which makes fused Adam/AdamW skip the update in its kernel (and take back its step
count). The first bad step is recorded on the device; the host reads the record only where Lightning waits for the
device anyway: at logging steps, at the end of the epoch and before a checkpoint is written, so no checkpoint ever
holds a skipped step's damage and the error still names the step.

Optimizers without that kernel (anything but fused Adam/AdamW, and vit/training/optim.py's Muon + AdamW, which reads it
the same way) fall back to a host check per step.
"""

import torch


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; the message names the step."""

    @classmethod
    def at(cls, loss: float, step: int, epoch: int, batch: int) -> "NonFiniteLossError":
        return cls(
            f"non-finite loss ({loss}) at step {step} (epoch {epoch}, batch {batch}); checkpoints written so far are "
            "intact. Try a lower --model.lr, --trainer.gradient_clip_val 1.0, or --model.skip_nonfinite true"
        )


def supports_found_inf(optimizer: torch.optim.Optimizer) -> bool:
    """Fused Adam/AdamW read `optimizer.found_inf` and skip the update when it is 1 (the attribute GradScaler sets);
    so does vit/training/optim.py's MuonWithAdamW (`skips_on_found_inf`)."""
    if getattr(optimizer, "skips_on_found_inf", False):
        return True
    return isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW) and bool(optimizer.defaults.get("fused"))


class NonFiniteGuard:
    """Device-side record of non-finite steps: which came first (global step, its loss) and how many there were.

    A step is non-finite when the loss of any of its micro-batches (`accumulate_grad_batches`) is, or when the total
    norm of the gradients about to be applied is (a finite loss can still give infinite gradients)."""

    def __init__(self) -> None:
        self.first_step: torch.Tensor | None = None  # () int64, -1: none yet
        self.first_loss: torch.Tensor | None = None  # () float32, the loss of that step
        self.count: torch.Tensor | None = None  # () int64
        self.positions: dict[int, tuple[int, int]] = {}  # global step -> (epoch, batch): host ints, names the step
        self.loss_bad: torch.Tensor | None = None  # () bool: a micro-batch of the pending step had a non-finite loss
        self.loss: torch.Tensor | None = None  # () float32: that micro-batch's loss (else the latest one)

    def _reset(self, device: torch.device) -> None:
        self.first_step = torch.full((), -1, dtype=torch.long, device=device)
        self.first_loss = torch.zeros((), device=device)
        self.count = torch.zeros((), dtype=torch.long, device=device)

    def on_loss(self, loss: torch.Tensor, step: int, epoch: int, batch: int) -> None:
        """Record a micro-batch's loss; with gradient accumulation several come before one optimizer step."""
        loss = loss.detach().float()
        bad = ~torch.isfinite(loss)
        if self.loss_bad is None:
            self.loss_bad, self.loss = bad, loss
        else:  # keep the first non-finite micro-batch's loss: it names what went wrong
            self.loss = torch.where(self.loss_bad, self.loss, loss)
            self.loss_bad = self.loss_bad | bad
        self.positions[step] = (epoch, batch)

    def before_optimizer_step(
        self, optimizer: torch.optim.Optimizer, grad_norm: torch.Tensor, step: int, world_size: int = 1
    ) -> None:
        """Set `optimizer.found_inf` (a device tensor) and record the step if a loss or the gradients' total norm
        (torch.nn.utils.get_total_norm, computed once for this check and for clipping) is not finite."""
        if self.loss_bad is None:
            return
        device = self.loss.device
        if self.first_step is None or self.first_step.device != device:
            self._reset(device)
        grads_bad = ~torch.isfinite(grad_norm.to(device))
        bad = self.loss_bad | grads_bad
        # With several processes the ranks can disagree on their own loss; after DDP's all-reduce they share the
        # gradients (a NaN anywhere makes every rank's norm NaN), so the skip is decided from those alone.
        found = grads_bad if world_size > 1 else bad
        optimizer.found_inf = found.float()  # read inside the fused kernel: no host sync
        hit = bad & (self.first_step < 0)
        self.first_step = torch.where(hit, step, self.first_step)
        self.first_loss = torch.where(hit, self.loss, self.first_loss)
        self.count += bad
        self.loss_bad = self.loss = None

    def take(self) -> tuple[int, int, int, int, float] | None:
        """Host read (a sync): None when every step since the last take was finite, else (count, step, epoch, batch,
        loss) of the first bad one. Clears the record."""
        if self.count is None:
            return None
        count = int(self.count)
        found = None
        if count:
            step = int(self.first_step)
            epoch, batch = self.positions.get(step, (-1, -1))
            found = (count, step, epoch, batch, float(self.first_loss))
            self._reset(self.count.device)
        self.positions.clear()
        return found
