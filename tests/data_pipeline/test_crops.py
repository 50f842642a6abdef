"""Batched crops and Random Erasing against torchvision: the same boxes give the same pixels, and the box samplers
follow torchvision's get_params."""

import math

import torch
import torchvision.transforms.v2.functional as TF
from torchvision.transforms import v2

import vit.data.crops as C


def _images(B: int, H: int, W: int) -> torch.Tensor:
    """A gradient with noise: every crop of it is different."""
    g = torch.Generator().manual_seed(0)
    base = torch.linspace(0, 255, W).expand(B, 3, H, W)
    return (base + torch.randint(-40, 40, (B, 3, H, W), generator=g)).clamp(0, 255).to(torch.uint8)


def test_random_resized_crop_matches_torchvision_on_the_same_box():
    # the in-memory path stores images at the training size: a crop is resized up (or kept), never down
    x = _images(B=4, H=32, W=32)
    boxes = torch.tensor([[0, 0, 32, 32], [5, 7, 20, 13], [10, 0, 22, 32], [1, 2, 3, 4]], dtype=torch.float32)
    ours = C.resized_crop(x, boxes, 32)
    for b in range(4):
        top, left, h, w = (int(v) for v in boxes[b])
        ref = TF.resized_crop(x[b], top, left, h, w, [32, 32], antialias=True)
        assert (ours[b].int() - ref.int()).abs().max() <= 1


def test_random_resized_crop_boxes_follow_torchvision_get_params():
    """Same distribution of area and aspect as torchvision's sampler: compare quantiles of many draws."""
    n = 4000
    ours = C.random_resized_crop_boxes(n, 32, 32, torch.Generator().manual_seed(0), scale=(0.35, 1.0))
    torch.manual_seed(0)
    theirs = torch.tensor(
        [
            v2.RandomResizedCrop.get_params(torch.zeros(3, 32, 32), scale=[0.35, 1.0], ratio=[3 / 4, 4 / 3])
            for _ in range(n)
        ],
        dtype=torch.float32,
    )
    q = torch.tensor([0.1, 0.5, 0.9])
    # each statistic at a tolerance under its own spread: the area in px^2 (418-870 here), the aspect (0.80-1.25: a
    # sampler without the log-uniform ratio, or with another range, moves the outer quantiles by 0.05 or more), the
    # centre in px (12.5-19.5)
    for stat, atol in ((lambda b: b[:, 2] * b[:, 3], 15.0), (lambda b: b[:, 3] / b[:, 2], 0.02),
                       (lambda b: b[:, 0] + b[:, 2] / 2, 0.6), (lambda b: b[:, 1] + b[:, 3] / 2, 0.6)):  # fmt: skip
        assert torch.allclose(stat(ours).quantile(q), stat(theirs).quantile(q), rtol=0, atol=atol)
    assert (ours[:, 0] + ours[:, 2] <= 32).all() and (ours[:, 1] + ours[:, 3] <= 32).all() and (ours >= 0).all()


def test_random_erasing_matches_torchvision_on_the_same_box_and_rate():
    x = torch.randn(3, 3, 32, 32)
    boxes = torch.tensor([[2, 3, 10, 5], [0, 0, 0, 0], [20, 30, 12, 2]], dtype=torch.float32)
    ours = C.erase(x, boxes, 0.0)
    for b in range(3):
        top, left, h, w = (int(v) for v in boxes[b])
        assert torch.equal(ours[b], TF.erase(x[b], top, left, h, w, torch.tensor(0.0)))
    erased = C.random_erasing_boxes(4000, 32, 32, 0.25, torch.Generator().manual_seed(0))
    rate = (erased[:, 2] > 0).float().mean().item()
    assert abs(rate - 0.25) < 0.03
    area = (erased[:, 2] * erased[:, 3])[erased[:, 2] > 0] / 1024
    assert 0.015 < area.min() and area.max() < 0.36 and math.isclose(area.median().item(), 0.175, abs_tol=0.04)


def test_random_erasing_in_place_erases_the_same_boxes_as_a_copy():
    x = torch.randn(64, 3, 16, 16)
    copy = C.random_erasing(x, 0.5, torch.Generator().manual_seed(1))
    assert not torch.equal(copy, x)  # some images erased, x untouched
    y = x.clone()
    out = C.random_erasing(y, 0.5, torch.Generator().manual_seed(1), inplace=True)
    assert out.data_ptr() == y.data_ptr() and torch.equal(y, copy)


def test_quarter_turns_match_torch_rot90_image_by_image_and_draw_all_four():
    x = _images(B=8, H=12, W=12)
    k = torch.tensor([0, 1, 2, 3, 3, 2, 1, 0])
    ours = C.quarter_turn(x, k)
    for b in range(8):
        assert torch.equal(ours[b], torch.rot90(x[b], int(k[b]), dims=(-2, -1)))
    drawn = C.quarter_turn_params(4000, torch.Generator().manual_seed(0))
    share = torch.bincount(drawn, minlength=4).float() / 4000
    assert drawn.min() == 0 and drawn.max() == 3 and (share - 0.25).abs().max() < 0.03


def test_quarter_turns_refuse_non_square_images():
    import pytest

    with pytest.raises(ValueError, match="square"):
        C.quarter_turn(_images(B=2, H=8, W=12), torch.tensor([1, 2]))
