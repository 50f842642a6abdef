"""Gradient norm and clipping on the device, for every optimizer and precision this toolkit trains with.

Lightning clips through its precision plugin, and under `bf16-mixed` (or `16-mixed`) that plugin refuses any optimizer
that "unscales internally" (`_step_supports_amp_scaling`): fused AdamW, the module's default, so every shipped CIFAR
config stopped at its first step (`RuntimeError: ... does not allow for gradient clipping`). bf16 has no loss scale,
so there is nothing to unscale and clipping is plain arithmetic on the gradients: `ViTClassifier` does it here
instead, from the usual `--trainer.gradient_clip_val` / `--trainer.gradient_clip_algorithm` flags.

The total norm is computed once per optimizer step (one `_foreach_norm`), on the device, and serves both the
non-finite check (vit/nonfinite.py) and clipping by norm: no host read, as in `torch.nn.utils.clip_grad_norm_`,
which these functions equal on the same gradients (tests/test_gradients.py).
"""

import torch


def grads_of(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The gradients the optimizer would apply (parameters without a gradient, e.g. frozen ones, left out)."""
    return [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of all gradients together: () float32 on their device (inf or NaN if any gradient is)."""
    if not grads:
        return torch.zeros(())
    norms = torch._foreach_norm(grads, 2, dtype=torch.float32)  # one kernel per device and dtype
    return torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms]))


def clip_by_norm_(grads: list[torch.Tensor], max_norm: float, norm: torch.Tensor) -> None:
    """Scale the gradients in place so that their total norm is at most max_norm (`norm`: their total_norm).
    The coefficient stays a device tensor: no `if norm > max_norm` on the host."""
    if not grads:
        return
    coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)  # clip_grad_norm_'s formula
    torch._foreach_mul_(grads, coef.to(grads[0].device))


def clip_by_value_(grads: list[torch.Tensor], clip_value: float) -> None:
    """Clamp every gradient element into [-clip_value, clip_value] in place."""
    if grads:
        torch._foreach_clamp_min_(grads, -clip_value)
        torch._foreach_clamp_max_(grads, clip_value)
