"""Test-time augmentation over flips and quarter turns (vit/evaluation/tta.py): the mean of the views' logits, and a
wrapped model that no pose of the group can move."""

import pytest
import torch

from vit.evaluation.tta import SymmetryTTA, tta_views
from vit.model.vision_transformer import VisionTransformer


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=3).eval()


def test_logits_are_the_mean_over_the_eight_poses(model):
    x = torch.randn(2, 3, 16, 16)
    poses = [torch.rot90(p, k, (-2, -1)) for p in (x, x.flip(-1)) for k in range(4)]
    with torch.no_grad():
        expected = torch.stack([model(p) for p in poses]).mean(0)
        torch.testing.assert_close(SymmetryTTA(model, hflip=True, rot90=True)(x), expected, atol=1e-5, rtol=1e-5)
        assert torch.equal(SymmetryTTA(model)(x), model(x))  # no views: the model itself


@pytest.mark.parametrize("hflip, rot90", [(True, False), (False, True), (True, True)])
def test_the_wrapped_model_is_invariant_under_its_group(model, hflip, rot90):
    x = torch.randn(2, 3, 16, 16)
    tta = SymmetryTTA(model, hflip=hflip, rot90=rot90)
    moved = [x.flip(-1)] if hflip else []
    moved += [torch.rot90(x, 1, (-2, -1))] if rot90 else []
    with torch.no_grad():
        for m in moved:
            torch.testing.assert_close(tta(m), tta(x), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(model(moved[0]), model(x), atol=1e-5)  # the bare model is not


def test_views_come_from_the_checkpoints_data_config():
    assert tta_views({"init_args": {"hflip": True, "rot90": True}}) == (True, True)
    assert tta_views({"class_path": "vit.data.DigitsDataModule", "init_args": {}}) == (False, False)
    assert tta_views(None) == (False, False)
