"""Mixture-of-Experts MLP: a router sends each token to its top-k of E expert MLPs (Switch / GShard style)."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
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
        B, N, D = x.shape
        tokens = x.reshape(-1, D)  # (T, D)
        probs, experts, weights = route(self.router(tokens), self.top_k)  # (T, E), (T, k), (T, k)
        T, E = tokens.shape[0], self.num_experts
        capacity = math.ceil(self.capacity_factor * T * self.top_k / E) if self.capacity_factor > 0 else T
        out = torch.zeros_like(tokens)
        counts = []
        for e, expert in enumerate(self.experts):
            token_idx, slot = (experts == e).nonzero(as_tuple=True)  # tokens routed to e, in token order
            token_idx, slot = token_idx[:capacity], slot[:capacity]  # over capacity: dropped for this expert
            counts.append(token_idx.numel())
            if token_idx.numel():
                y = expert(tokens[token_idx]) * weights[token_idx, slot, None].to(tokens.dtype)
                out = out.index_add(0, token_idx, y)
        first = F.one_hot(experts[:, 0], E).float().mean(dim=0)  # f_e
        self.aux_loss = E * (first * probs.mean(dim=0)).sum()
        self.expert_counts = torch.tensor(counts)
        return out.reshape(B, N, D)
