"""The per-image torchvision pipelines: training augmentation and evaluation preprocessing.

The in-memory path (vit/data/device.py) does the same on whole batches on the training device; these are the
DataLoader path's (streaming, `in_memory: false`) and the reference the batched one is tested against.
"""

import logging
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Literal

import torch
from torchvision.transforms import v2

from vit.data.augment import BatchAutoAugment
from vit.data.images import eval_geometry

log = logging.getLogger(__name__)
AutoAugment = Literal["none", "randaugment", "trivialaugment", "autoaugment"]


class DataError(ValueError):
    """Data that cannot be used: missing, unreadable or inconsistent. The message names the path or field."""


def augment_policy(name: AutoAugment, autoaugment_policy=v2.AutoAugmentPolicy.IMAGENET) -> v2.Transform | None:
    """The torchvision policy for a config name ('none' -> None); works on PIL images and uint8 tensors."""
    policies = {
        "randaugment": v2.RandAugment,
        "trivialaugment": v2.TrivialAugmentWide,
        "autoaugment": partial(v2.AutoAugment, autoaugment_policy),
    }
    if name == "none":
        return None
    if name not in policies:
        raise ValueError(f"auto_augment={name!r} is not one of {['none', *policies]}")
    return policies[name]()


@dataclass(frozen=True)
class Augmentation:
    """A training split's augmentation, declared once for both paths: the per-image transforms (train_transform:
    streaming, `in_memory: false`) and the batched ones on the device (vit.data.device.DeviceBatches), which draw the
    same operations. Each DataModule builds one from its flags; the default augments nothing (evaluation).

    Args:
        crop_padding: a random crop of the image padded by this many pixels (0: none); not with rrc_scale.
        hflip: a random horizontal flip.
        rot90: a random quarter turn of each image (square images) after crop and flip: with `hflip`, all 8
            symmetries of the square, for classes that keep their label under them (tiles, slides, textures).
        rrc_scale: RandomResizedCrop's area range (e.g. (0.35, 1.0)) instead of the padded crop; None: off.
        auto_augment: a policy by name after crop, flip and turn; `autoaugment_policy` names AutoAugment's table
            ("imagenet", "cifar10", "svhn").
        erasing: Random Erasing probability per image, after Normalize (value 0: the mean colour).
    """

    crop_padding: int = 0
    hflip: bool = False
    rot90: bool = False
    rrc_scale: tuple[float, float] | None = None
    auto_augment: AutoAugment = "none"
    autoaugment_policy: str = "imagenet"
    erasing: float = 0.0

    def __post_init__(self):
        if self.auto_augment != "none":
            augment_policy(self.auto_augment)  # an unknown name: one line, when the DataModule is built

    @cached_property
    def batch_policy(self) -> BatchAutoAugment | None:
        """The batched form of the policy (vit.data.augment), built once and shared by the split's loaders."""
        return batch_policy(self.auto_augment, self.autoaugment_policy)


def train_transform(img_size: int, mean, std, augmentation: Augmentation) -> v2.Compose:
    """Training augmentation for a PIL image or a uint8 (C, H, W) tensor -> normalised float tensor. The reference
    that the batched in-memory path (vit.data.device, vit.data.augment) reproduces, drawing per image."""
    a = augmentation
    if a.rrc_scale is not None:
        ops = [v2.RandomResizedCrop(img_size, scale=tuple(a.rrc_scale), antialias=True)]
    else:
        ops = [v2.RandomCrop(img_size, padding=a.crop_padding)] if a.crop_padding else []
    if a.hflip:
        ops.append(v2.RandomHorizontalFlip())
    if a.auto_augment != "none":
        ops.append(augment_policy(a.auto_augment, v2.AutoAugmentPolicy(a.autoaugment_policy)))
    tail = [v2.RandomErasing(a.erasing, value=0)] if a.erasing > 0 else []
    turn = [RandomQuarterTurn()] if a.rot90 else []
    return v2.Compose(
        [*ops, v2.ToImage(), *turn, v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std), *tail]
    )


class RandomQuarterTurn(torch.nn.Module):
    """Turn a square (C, H, W) image tensor 0-3 quarter turns, each equally likely (torchvision has no such transform;
    RandomRotation resamples). The reference of the in-memory path's vit.data.crops.quarter_turn."""

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        return torch.rot90(img, int(torch.randint(0, 4, ())), dims=(-2, -1))


def check_crop_scale(crop_scale) -> tuple[float, float] | None:
    """None, or RandomResizedCrop's (min, max) share of the area: one line naming the value when it is not one."""
    if crop_scale is None:
        return None
    if len(crop_scale) != 2 or not 0.0 < crop_scale[0] <= crop_scale[1] <= 1.0:
        raise ValueError(f"crop_scale={tuple(crop_scale)} must satisfy 0 < min <= max <= 1")
    return (float(crop_scale[0]), float(crop_scale[1]))


def batch_policy(name: AutoAugment, autoaugment_policy: str = "imagenet") -> BatchAutoAugment | None:
    """The batched form (vit.data.augment) of augment_policy's torchvision policy: 'autoaugment' takes the dataset's
    policy ('imagenet', 'cifar10', 'svhn')."""
    if name == "none":
        return None
    augment_policy(name)  # the same one-line error for an unknown name
    return BatchAutoAugment(f"autoaugment_{autoaugment_policy}" if name == "autoaugment" else name)


def to_normalized(mean, std) -> v2.Compose:
    """uint8 images -> float, scaled to [0, 1] and normalised: the per-item form of the in-memory sets (their batches,
    predict and serve take normalize_uint8, the fused version of the same on the device)."""
    return v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])


def uint8_affine(mean, std, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, shift), each (C, 1, 1) float32 on `device` (or on mean's, for a tensor): x * scale + shift equals
    ToDtype(scale=True) + Normalize(mean, std) on uint8 x, (x / 255 - mean) / std, to float rounding."""
    mean = torch.as_tensor(mean, dtype=torch.float32, device=device).reshape(-1, 1, 1) * 255
    std = torch.as_tensor(std, dtype=torch.float32, device=device).reshape(-1, 1, 1) * 255
    return 1.0 / std, -mean / std


def normalize_uint8(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """uint8 (B, C, H, W) -> normalised float32, a new tensor, as one multiply-add in place on it (uint8_affine's
    scale and shift): training's batches, predict, eval and serve all take this one. (0.45 vs 0.9 ms for 256 CIFAR
    images on 1 core against ToDtype + Normalize: no temporaries.) Float pixels (16-bit, multi-band data) are in
    [0, 1] already: 255 times the scale."""
    return x.to(torch.float32, copy=True).mul_(scale if x.dtype == torch.uint8 else scale * 255).add_(shift)


def eval_transform(img_size: int, mean, std) -> v2.Compose:
    """Evaluation and predict preprocessing: eval_geometry, then scale to [0, 1] and normalise."""
    return v2.Compose([eval_geometry(img_size), *to_normalized(mean, std).transforms])
