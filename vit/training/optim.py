"""Muon for the hidden matrices, AdamW for everything else, as one optimizer.

Muon (Jordan et al. 2024) orthogonalises the momentum of 2D weight matrices with a few Newton-Schulz steps; it is
meant for the hidden matrices only (attention qkv/proj, MLP fc1/fc2). The patch embedding (a conv), position
embeddings, norms, biases and the classifier head stay with AdamW. Lightning's automatic optimization and one LambdaLR
schedule want a single optimizer, so `MuonWithAdamW` owns both and shares their parameter groups: setting a group's
"lr" (the scheduler) reaches the optimizer that owns it. Muon's update is scaled to AdamW's RMS (torch's
`adjust_lr_fn="match_rms_adamw"`, Moonshot's rule), so both take the same learning rate and weight decay.

`Muon` here is `torch.optim.Muon`'s algorithm (same defaults, same state key, tested against it), written again
because torch's runs the Newton-Schulz steps in bf16, one matrix at a time: on this project's 2-core Xeon (no AMX)
that took 32 ms a step for 64x3's twelve matrices, and made 15-minute epochs 60% longer (12-15 s -> 19-22 s); stacked
by shape and in fp32 on a CPU it took 7 ms. On a GPU it keeps bf16, as torch does.
"""

import math

import torch
from torch import nn
from torch.nn.utils import clip_grad_value_, clip_grads_with_norm_, get_total_norm

from vit.training.schedules import layer_id

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # torch.optim.Muon's quintic iteration


def newton_schulz(g: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """Approximately orthogonalise a stack of matrices: (K, A, B) with A <= B -> (K, A, B), singular values ~1."""
    a, b, c = NS_COEFFICIENTS
    x = g / g.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)  # spectral norm <= 1
    for _ in range(steps):
        gram = x @ x.mT  # (K, A, A)
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x


class Muon(torch.optim.Optimizer):
    """`torch.optim.Muon` with `adjust_lr_fn="match_rms_adamw"`, its Newton-Schulz steps batched over matrices of
    one shape, in fp32 on CPUs and bf16 on GPUs (`ns_dtype` overrides). Like fused AdamW it reads `found_inf` (a
    device tensor, set by vit/training/nonfinite.py) and leaves weights and momentum as they were when it is 1: no host
    sync."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        ns_dtype: torch.dtype | None = None,
    ):
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"Muon trains 2D matrices only; got a parameter of shape {tuple(p.shape)}")
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found_inf = getattr(self, "found_inf", None)
        skip = None if found_inf is None else found_inf.bool()  # () on the device
        for group in self.param_groups:
            lr, wd, mom = group["lr"], group["weight_decay"], group["momentum"]
            by_shape: dict[tuple, list] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buf = state["momentum_buffer"]
                if skip is None:
                    buf.lerp_(p.grad, 1 - mom)
                else:  # a skipped step's NaN gradient must not reach the momentum
                    buf.copy_(torch.where(skip, buf, buf.lerp(p.grad, 1 - mom)))
                update = p.grad.lerp(buf, mom) if group["nesterov"] else buf
                by_shape.setdefault(tuple(p.shape), []).append((p, update))
            for (rows, cols), items in by_shape.items():
                dtype = self.ns_dtype or (torch.bfloat16 if items[0][0].is_cuda else torch.float32)
                u = torch.stack([x for _, x in items]).to(dtype)  # (K, rows, cols)
                tall = rows > cols
                o = newton_schulz(u.mT if tall else u, group["ns_steps"])
                o = o.mT if tall else o
                scale = 0.2 * math.sqrt(max(rows, cols))  # match_rms_adamw: the update's RMS is AdamW's
                for (p, _), oi in zip(items, o):
                    if skip is None:
                        p.mul_(1 - lr * wd)
                        p.add_(oi.to(p.dtype), alpha=-lr * scale)
                    else:
                        p.copy_(torch.where(skip, p, p * (1 - lr * wd) - (lr * scale) * oi.to(p.dtype)))
        return loss


def is_hidden_matrix(name: str, p: torch.Tensor) -> bool:
    """The weights Muon trains: 2D matrices inside the transformer blocks (not the patch embedding or the head)."""
    return p.ndim == 2 and name.startswith("blocks.")


class MuonWithAdamW(torch.optim.Optimizer):
    """`Muon` on `muon_groups` and fused `torch.optim.AdamW` on `adamw_groups`, stepped together.

    Each group is a dict with "params", "lr" and "weight_decay" as for any torch optimizer."""

    def __init__(
        self,
        muon_groups: list[dict],
        adamw_groups: list[dict],
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        momentum: float = 0.95,
    ):
        self.muon = Muon(muon_groups, lr=lr, momentum=momentum)
        self.adamw = torch.optim.AdamW(adamw_groups, lr=lr, betas=betas, fused=True)
        # The same dict objects: a scheduler writing self.param_groups[i]["lr"] writes the owner's group.
        super().__init__(self.muon.param_groups + self.adamw.param_groups, {"lr": lr})

    # nonfinite.py sets `found_inf` before each step; both optimizers skip the update on the device when it is 1.
    skips_on_found_inf = True

    @property
    def found_inf(self) -> torch.Tensor | None:
        return getattr(self.adamw, "found_inf", None)

    @found_inf.setter
    def found_inf(self, value: torch.Tensor | None) -> None:
        self.muon.found_inf = value
        self.adamw.found_inf = value

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none)
        self.adamw.zero_grad(set_to_none)

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        if set(state_dict) != {"muon", "adamw"}:
            raise ValueError(
                f"optimizer state has keys {sorted(state_dict)}, not a MuonWithAdamW state ('muon', 'adamw'): "
                "was the checkpoint trained with --model.optimizer adamw?"
            )
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])


def split_for_muon(model: nn.Module, groups: list[dict]) -> tuple[list[dict], list[dict]]:
    """Split parameter groups (each with "params") into Muon's hidden matrices and AdamW's rest, keeping each
    group's other settings."""
    hidden = {id(p) for name, p in model.named_parameters() if is_hidden_matrix(name, p)}
    muon, adamw = [], []
    for g in groups:
        for target, keep in ((muon, True), (adamw, False)):
            params = [p for p in g["params"] if (id(p) in hidden) == keep]
            if params:
                target.append({**g, "params": params})
    return muon, adamw


def decay_groups(model: nn.Module, lr: float, weight_decay: float, layer_decay: float | None) -> list[dict]:
    """AdamW's parameter groups for the ViT: no decay on norms, biases and `model.no_weight_decay()`; with
    `layer_decay` (BEiT), block i of L at lr * layer_decay ** (L + 1 - i)."""
    skip, depth = model.no_weight_decay(), len(model.blocks)
    groups: dict[tuple[int, bool], list] = {}  # (layer id, decayed) -> params
    for name, p in model.named_parameters():
        no_decay = p.ndim <= 1 or name in skip
        # Groups per layer only when layer_decay needs them: fused AdamW runs one kernel per group (10 groups
        # instead of 2: 1% more per digits epoch on a 2-core CPU).
        layer = layer_id(name, depth) if layer_decay else depth + 1
        groups.setdefault((layer, not no_decay), []).append(p)
    return [
        {
            "params": params,
            "weight_decay": weight_decay if decayed else 0.0,
            "lr": lr * (layer_decay ** (depth + 1 - layer) if layer_decay else 1.0),
        }
        for (layer, decayed), params in sorted(groups.items())
    ]


def build_optimizer(
    model: nn.Module,
    beside: list[nn.Module],
    *,
    optimizer: str,
    lr: float,
    weight_decay: float,
    layer_decay: float | None,
    betas: tuple[float, float],
) -> torch.optim.Optimizer:
    """The optimizer of a run: "adamw" (fused) or "muon" (Muon for the blocks' matrices, AdamW for the rest) over the
    model's decay groups (decay_groups), and AdamW over the parameters of the modules trained `beside` it (DRLoc's MLP,
    locality guidance's maps: Muon's matrices are the ViT's own)."""
    groups = decay_groups(model, lr, weight_decay, layer_decay)
    groups += [{"params": list(m.parameters()), "weight_decay": weight_decay} for m in beside]
    if optimizer == "muon":
        return MuonWithAdamW(*split_for_muon(model, groups), lr=lr, betas=betas)
    # fused: one kernel for all parameters; on CPU the default is a Python loop per tensor (measured 0.7 s of an 8.7 s
    # digits run in _single_tensor_adam)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True)


def params_with_grads(optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    """The parameters the optimizer would update (those without a gradient, e.g. frozen ones, left out)."""
    return [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def grads_of(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p.grad for p in params_with_grads(getattr(optimizer, "optimizer", optimizer))]


def clip_on_device(optimizer: torch.optim.Optimizer, value: float, algorithm: str | None, norm: torch.Tensor | None):
    """Clip the gradients of `optimizer`'s parameters by `value` ("value"), or by their total norm (else; `norm`: the
    () total norm already computed this step, None: computed here), on the device: no host read."""
    params = params_with_grads(optimizer)
    if algorithm == "value":
        clip_grad_value_(params, value, foreach=True)
        return
    norm = norm if norm is not None else get_total_norm(grads_of(optimizer), foreach=True)
    clip_grads_with_norm_(params, value, norm, foreach=True)  # the coefficient stays on the device
