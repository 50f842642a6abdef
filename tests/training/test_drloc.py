"""vit/training/drloc.py: DRLoc's auxiliary loss, its place in the training loss, and that nothing downstream sees it"""

import pytest
import torch
import torch.nn.functional as F

from vit.model.config import ViTConfig
from vit.training.drloc import RelativeLocalization
from vit.training.module import ViTClassifier


def test_the_loss_is_the_l1_error_of_each_pairs_offset_row_by_row_on_a_grid_that_is_not_square():
    drloc = RelativeLocalization(dim=5, pairs=7)
    tokens = torch.randn(3, 12, 5)  # a 3 x 4 grid, row by row
    torch.manual_seed(0)
    loss = drloc(tokens, (3, 4))
    torch.manual_seed(0)
    idx = torch.randint(12, (2, 3, 7))  # the same draws
    errors = []
    for b in range(3):
        for p in range(7):
            i, j = int(idx[0, b, p]), int(idx[1, b, p])
            target = torch.tensor([(i // 4 - j // 4) / 3, (i % 4 - j % 4) / 4])
            predicted = drloc.mlp(torch.cat([tokens[b, i], tokens[b, j]]))
            errors.append((predicted - target).abs())
    assert loss.item() == pytest.approx(torch.stack(errors).mean().item(), rel=1e-5)


def test_tokens_that_know_where_they_are_give_a_zero_loss_and_a_wrong_grid_is_named():
    drloc = RelativeLocalization(dim=2, pairs=50)
    rows, cols = torch.meshgrid(torch.arange(3) / 3, torch.arange(4) / 4, indexing="ij")
    tokens = torch.stack([rows.flatten(), cols.flatten()], -1).expand(2, -1, -1)  # (2, 12, 2): each its position
    drloc.mlp = torch.nn.Linear(4, 2, bias=False)  # a perfect reader: the first position minus the second
    drloc.mlp.weight.data = torch.tensor([[1.0, 0, -1, 0], [0, 1, 0, -1]])
    assert drloc(tokens, (3, 4)).item() == pytest.approx(0.0, abs=1e-6)
    assert drloc(tokens, (4, 3)).item() > 0.05  # columns read as rows: the targets are row by row
    with pytest.raises(ValueError, match="12 tokens are not the 4 x 4 grid"):
        drloc(tokens, (4, 4))


def test_the_training_loss_adds_the_weighted_drloc_loss_and_its_mlp_is_trained():
    arch = ViTConfig(img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3)
    module = ViTClassifier(arch=arch, drloc_weight=0.25, label_smoothing=0.0)
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 0])
    torch.manual_seed(1)
    loss = module.training_step((x, y), 0)
    tokens = module.model.forward_features(x)
    torch.manual_seed(1)
    expected = F.cross_entropy(module(x), y) + 0.25 * module.drloc(tokens[:, module.model.num_prefix_tokens :], (4, 4))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    module.trainer = type("T", (), {"estimated_stepping_batches": 10, "max_epochs": 1, "callbacks": []})()
    optimized = {id(p) for g in module.configure_optimizers()["optimizer"].param_groups for p in g["params"]}
    assert {id(p) for p in module.drloc.parameters()} <= optimized
    with pytest.raises(ValueError, match="drloc_weight=0.1 .* patch_drop_rate=0.5"):
        ViTClassifier(arch=ViTConfig(patch_drop_rate=0.5), drloc_weight=0.1)
    assert ViTClassifier(arch=arch).drloc is None  # off by default: no extra weights
