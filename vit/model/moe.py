"""Mixture-of-Experts MLP: a router sends each token to its top-k of E expert MLPs (Switch / GShard style)."""

import math

import torch
import torch.nn as nn
from timm.layers import Mlp


def route(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Router logits (T, E) -> softmax probabilities (T, E), the top-k experts of each token (T, k) and their weights
    (T, k), renormalised to sum to 1 over the chosen experts."""
    probs = logits.float().softmax(dim=-1)
    weights, experts = probs.topk(top_k, dim=-1)
    return probs, experts, weights / weights.sum(dim=-1, keepdim=True)


class MoEMlp(nn.Module):
    """E GELU MLPs of `hidden` units and a linear router. Each token goes to exactly its top_k experts, weighted by
    the renormalised router probabilities; an expert takes at most capacity_factor * T * k / E tokens of a batch
    (the others get nothing from it: the residual carries them). `aux_loss` after a forward is Switch's
    load-balancing loss E * sum_e f_e * P_e (f_e: share of tokens whose first choice is e, P_e: mean router
    probability of e); `expert_counts` counts the tokens each expert received."""

    def __init__(
        self, dim: int, hidden: int, num_experts: int, top_k: int = 2, capacity_factor: float = 1.25, drop: float = 0.0
    ):
        super().__init__()
        self.num_experts, self.top_k, self.capacity_factor = num_experts, top_k, capacity_factor
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.experts = nn.ModuleList([Mlp(dim, hidden, act_layer=nn.GELU, drop=drop) for _ in range(num_experts)])
        self.aux_loss = torch.zeros(())
        self.expert_counts = torch.zeros(num_experts, dtype=torch.long)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Capacity-padded dispatch: every shape is known from (B, N) alone, so nothing is read back to the host (a
        # `nonzero` per expert was a synchronisation per expert and block on a GPU, and broke torch.compile's graph).
        B, N, D = x.shape
        tokens = x.reshape(-1, D)  # (T, D)
        probs, experts, weights = route(self.router(tokens), self.top_k)  # (T, E), (T, k), (T, k)
        T, E = tokens.shape[0], self.num_experts
        C = math.ceil(self.capacity_factor * T * self.top_k / E) if self.capacity_factor > 0 else T  # capacity
        flat = experts.reshape(-1)  # (T * k,) in token order, then slot: the order in which experts fill up
        chosen = flat[:, None] == torch.arange(E, device=x.device)  # (T * k, E)
        position = (chosen.long().cumsum(0) - 1).gather(1, flat[:, None]).squeeze(1)  # place in its expert's queue
        kept = position < C  # over capacity: dropped for this expert (the residual carries the token)
        slot = torch.where(kept, flat * C + position, E * C)  # row of the (E * C + 1, D) buffer; E * C: discarded
        source = torch.arange(T, device=x.device)[:, None].expand(T, self.top_k).reshape(-1)  # (T * k,) its token
        buffer = tokens.new_zeros(E * C + 1, D).index_add(0, slot, tokens[source])  # each kept row written once
        done = torch.cat([expert(buffer[e * C : (e + 1) * C]) for e, expert in enumerate(self.experts)])  # (E * C, D)
        done = torch.cat([done, done.new_zeros(1, D)])
        gate = weights.reshape(-1, 1).to(tokens.dtype) * kept[:, None]  # (T * k, 1)
        out = torch.zeros_like(tokens).index_add(0, source, done[slot] * gate)
        first = torch.zeros(E, device=x.device).index_add(0, experts[:, 0], torch.ones(T, device=x.device)) / T  # f_e
        self.aux_loss = E * (first * probs.mean(dim=0)).sum()
        self.expert_counts = chosen.sum(0).clamp(max=C)  # (E,) tokens each expert received, on the device
        return out.reshape(B, N, D)
