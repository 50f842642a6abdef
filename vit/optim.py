"""Muon for the hidden matrices, AdamW for everything else, as one optimizer.

Muon (Jordan et al. 2024; `torch.optim.Muon`) orthogonalises the momentum of 2D weight matrices with a few
Newton-Schulz steps; it is meant for the hidden matrices only (attention qkv/proj, MLP fc1/fc2). The patch embedding
(a conv), position embeddings, norms, biases and the classifier head stay with AdamW. Lightning's automatic
optimization and one LambdaLR schedule want a single optimizer, so this class owns both and shares their parameter
groups: setting a group's "lr" (the scheduler) reaches the optimizer that owns it. With `adjust_lr_fn=
"match_rms_adamw"`, Muon's update has AdamW's RMS, so both take the same learning rate and weight decay.
"""

import torch
from torch import nn

# Muon's update is scaled to AdamW's RMS (torch's "match_rms_adamw", Moonshot's rule): one lr serves both optimizers.
MUON_LR_RULE = "match_rms_adamw"


def is_hidden_matrix(name: str, p: torch.Tensor) -> bool:
    """The weights Muon trains: 2D matrices inside the transformer blocks (not the patch embedding or the head)."""
    return p.ndim == 2 and name.startswith("blocks.")


class MuonWithAdamW(torch.optim.Optimizer):
    """`torch.optim.Muon` on `muon_groups` and fused `torch.optim.AdamW` on `adamw_groups`, stepped together.

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
        self.muon = torch.optim.Muon(muon_groups, lr=lr, momentum=momentum, adjust_lr_fn=MUON_LR_RULE)
        self.adamw = torch.optim.AdamW(adamw_groups, lr=lr, betas=betas, fused=True)
        # The same dict objects: a scheduler writing self.param_groups[i]["lr"] writes the owner's group.
        super().__init__(self.muon.param_groups + self.adamw.param_groups, {"lr": lr})

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
