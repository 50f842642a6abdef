"""Mixture of Experts: routing on hand-made router logits, capacity, the load-balancing loss, E = 1 = dense MLP,
and the expert-usage histogram in TensorBoard."""

from pathlib import Path

import pytest
import torch
import torch.nn as nn
from conftest import fit_in
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from vit.model.config import ViTConfig
from vit.model.moe import MoEMlp, route
from vit.model.vision_transformer import Block

ROOT = Path(__file__).parents[2]


class FixedRouter(nn.Module):
    """A router that returns hand-made logits, whatever the tokens."""

    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def forward(self, tokens):
        return self.logits


def test_route_picks_exactly_the_top_k_and_renormalises():
    logits = torch.tensor([[3.0, 1.0, 2.0, 0.0], [0.0, 0.0, 5.0, 4.0], [1.0, 2.0, 3.0, 4.0]])
    probs, experts, weights = route(logits, top_k=2)
    assert experts.tolist() == [[0, 2], [2, 3], [3, 2]]
    p = logits.softmax(-1)
    torch.testing.assert_close(weights[0], p[0, [0, 2]] / p[0, [0, 2]].sum())
    torch.testing.assert_close(weights.sum(-1), torch.ones(3))


def test_each_token_gets_the_weighted_sum_of_its_top_k_experts():
    torch.manual_seed(0)
    moe = MoEMlp(8, 16, num_experts=4, top_k=2, capacity_factor=0).eval()  # no capacity limit
    x = torch.randn(1, 5, 8)
    logits = torch.randn(5, 4)
    moe.router = FixedRouter(logits)
    out = moe(x)[0]
    _, experts, weights = route(logits, 2)
    for t in range(5):
        expect = sum(w * moe.experts[e](x[0, t : t + 1])[0] for e, w in zip(experts[t].tolist(), weights[t]))
        torch.testing.assert_close(out[t], expect, atol=1e-6, rtol=0)
    assert moe.expert_counts.sum() == 5 * 2  # every token reached exactly two experts


def test_capacity_drops_the_tokens_over_it():
    moe = MoEMlp(8, 16, num_experts=2, top_k=1, capacity_factor=0.5).eval()  # capacity ceil(0.5 * 8 / 2) = 2
    moe.router = FixedRouter(torch.tensor([[5.0, 0.0]] * 8))  # all 8 tokens want expert 0
    out = moe(torch.randn(1, 8, 8))[0]
    assert moe.expert_counts.tolist() == [2, 0]
    assert out[:2].abs().sum() > 0 and out[2:].abs().sum() == 0  # the first two in token order were served


def test_load_balancing_loss_matches_switch_formula():
    moe = MoEMlp(8, 16, num_experts=4, top_k=2)
    logits = torch.randn(12, 4)
    moe.router = FixedRouter(logits)
    moe(torch.randn(2, 6, 8))
    probs = logits.softmax(-1)
    first = torch.bincount(probs.argmax(-1), minlength=4).float() / 12
    torch.testing.assert_close(moe.aux_loss, 4 * (first * probs.mean(0)).sum())
    moe.router = FixedRouter(torch.zeros(12, 4))  # a uniform router: the loss is 1 whatever the tie-break
    moe(torch.randn(2, 6, 8))
    assert moe.aux_loss.item() == pytest.approx(1.0)


def test_one_expert_is_the_dense_mlp():
    torch.manual_seed(0)
    dense = Block(ViTConfig(embed_dim=16, num_heads=2)).eval()
    moe = Block(ViTConfig(embed_dim=16, num_heads=2, moe_experts=1, moe_top_k=1)).eval()
    state = dense.state_dict()
    moe.load_state_dict({k.replace("mlp.", "mlp.experts.0."): v for k, v in state.items()}, strict=False)
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(moe(x), dense(x), atol=1e-6, rtol=0)


def test_aux_loss_and_expert_usage_reach_tensorboard(tmp_path):
    fit_in(
        tmp_path,
        [
            "fit",
            "--config",
            str(ROOT / "configs" / "smoke.yaml"),
            "--config",
            str(ROOT / "configs" / "variants" / "moe.yaml"),
            "--trainer.enable_progress_bar",
            "false",
            "--attention_maps.every_n_epochs",
            "100",
        ],
    )
    ea = EventAccumulator(str(tmp_path / "logs" / "smoke" / "version_0"), size_guidance={"histograms": 0})
    ea.Reload()
    assert {"moe/expert_usage/layer_0", "moe/expert_usage/layer_1"} <= set(ea.Tags()["histograms"])
    usage = ea.Histograms("moe/expert_usage/layer_0")
    # 4 steps x 32 images x 16 tokens x top-2, less the few tokens an expert over its capacity (1.25x its share) drops
    full = 4 * 32 * 16 * 2
    assert len(usage) == 2 and 0.9 * full <= usage[0].histogram_value.num <= full
    assert all(e.value > 0 for e in ea.Scalars("train/moe_aux_loss"))
