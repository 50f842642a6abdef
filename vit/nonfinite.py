"""Non-finite losses and gradients, handled without reading a value on the host at every step.

`if not torch.isfinite(loss)` in a training step makes the host wait for the device (a synchronisation per step on
GPU). Instead the decision stays on the device, as under torch's GradScaler: before each optimizer step the guard
checks the loss (and with several processes the all-reduced gradients, so every rank decides the same) and sets
the optimizer's `found_inf`, which makes fused Adam/AdamW skip the update in its kernel (and take back its step
count). The first bad step is recorded on the device; the host reads the record only where Lightning waits for the
device anyway: at logging steps, at the end of the epoch and before a checkpoint is written, so no checkpoint ever
holds a skipped step's damage and the error still names the step.

Optimizers without that kernel (anything but fused Adam/AdamW, and vit/optim.py's Muon + AdamW, which reads it the
same way) fall back to a host check per step.
"""

import torch


def supports_found_inf(optimizer: torch.optim.Optimizer) -> bool:
    """Fused Adam/AdamW read `optimizer.found_inf` and skip the update when it is 1 (the attribute GradScaler sets);
    so does vit/optim.py's MuonWithAdamW (`skips_on_found_inf`)."""
    if getattr(optimizer, "skips_on_found_inf", False):
        return True
    return isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW) and bool(optimizer.defaults.get("fused"))


class NonFiniteGuard:
    """Device-side record of non-finite steps: which came first (global step, its loss) and how many there were."""

    def __init__(self) -> None:
        self.first_step: torch.Tensor | None = None  # () int64, -1: none yet
        self.first_loss: torch.Tensor | None = None  # () float32, the loss of that step
        self.count: torch.Tensor | None = None  # () int64
        self.positions: dict[int, tuple[int, int]] = {}  # global step -> (epoch, batch): host ints, names the step
        self.last_loss: torch.Tensor | None = None

    def _reset(self, device: torch.device) -> None:
        self.first_step = torch.full((), -1, dtype=torch.long, device=device)
        self.first_loss = torch.zeros((), device=device)
        self.count = torch.zeros((), dtype=torch.long, device=device)

    def on_loss(self, loss: torch.Tensor, step: int, epoch: int, batch: int) -> None:
        self.last_loss = loss.detach().float()
        self.positions[step] = (epoch, batch)

    def before_optimizer_step(
        self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor], step: int, world_size: int = 1
    ) -> None:
        """Set `optimizer.found_inf` (a device tensor) and record the step if the loss or a gradient is not finite."""
        if self.last_loss is None:
            return
        device = self.last_loss.device
        if self.first_step is None or self.first_step.device != device:
            self._reset(device)
        bad = ~torch.isfinite(self.last_loss)  # a NaN or inf loss makes NaN gradients
        if world_size > 1:
            # Ranks can disagree on their own loss; after DDP's all-reduce they share the gradients, so the skip is
            # decided from those (a NaN or inf anywhere makes its norm NaN or inf; one kernel for all the norms).
            grads = [p.grad for p in params if p.grad is not None]
            found = ~torch.isfinite(torch.stack(torch._foreach_norm(grads))).all() if grads else torch.zeros_like(bad)
            bad = bad | found
        else:
            found = bad
        optimizer.found_inf = found.float()  # read inside the fused kernel: no host sync
        hit = bad & (self.first_step < 0)
        self.first_step = torch.where(hit, step, self.first_step)
        self.first_loss = torch.where(hit, self.last_loss, self.first_loss)
        self.count += bad

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
