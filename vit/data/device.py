"""The in-memory data path: the whole dataset as one uint8 tensor on the training device, augmented a batch at a time.

For data that fits in memory (digits, CIFAR, image folders) this replaces the DataLoader: no per-image PIL work, no
worker processes and no per-image Python on the hot path. Augmentation semantics are those of the torchvision path
(`vit.data.transforms.train_transform`), drawn per image (a whole epoch's choices at once) but applied to the whole
batch (vit/data/crops.py, vit/data/augment.py): RandomResizedCrop or RandomCrop with zero padding, horizontal flip with
p = 0.5, a random quarter turn, an AutoAugment-family policy, ToDtype(scale) and Normalize, Random Erasing. Mixup/CutMix
stay in the LightningModule.

    batches = DeviceBatches(images_uint8, targets, 64, m, s, train=True, augmentation=Augmentation(crop_padding=4))
    for epoch in range(E):
        batches.set_epoch(epoch)   # Lightning calls it: the shuffle and the augmentation are seeded per epoch
        for x, y in batches: ...   # x: (B, C, H, W) float32 normalised, on images.device
"""

from collections.abc import Iterator

import torch
import torch.nn.functional as F

from vit.data.crops import (
    crop_flip,
    crop_flip_params,
    erase,
    quarter_turn,
    quarter_turn_params,
    random_erasing_boxes,
    random_resized_crop_boxes,
    resized_crop,
)
from vit.data.transforms import Augmentation, normalize_uint8, uint8_affine

IGNORE = -100  # the target of an evaluation padding item: F.cross_entropy's and the metrics' ignore_index


class DeviceBatches:
    """Batches of (normalised float images, targets) from uint8 images held on one device.

    Args:
        images: (N, C, H, W) uint8, or float32 in [0, 1] (16-bit or multi-band data), already on the device to train on.
        train: shuffle (seeded by `seed` and the epoch) and augment; otherwise fixed order, no augmentation.
        augmentation: what a training epoch draws per image (vit.data.transforms.Augmentation: crop, flip, turn,
            policy, erasing), as the per-image path's train_transform does; unused in evaluation.
        out_size: upsample the batch to out_size x out_size (bilinear) after augmentation, e.g. CIFAR at 224 px
            for an ImageNet-pretrained ViT.
        rank, world_size: data-parallel shard, as DistributedSampler: rank r takes positions r, r + W, ... of the
            epoch's permutation, so W ranks of batch b see the same images as one process of batch W * b. The
            permutation is padded to a multiple of W so that every rank has the same number of batches (a rank with
            one batch fewer leaves the others waiting in an all-reduce forever): in training with the first images
            again, as DistributedSampler does; in evaluation with targets of IGNORE, which the metrics and the loss
            leave out, so that nothing is counted twice.
    """

    def __init__(
        self,
        images: torch.Tensor,
        targets: torch.Tensor,
        batch_size: int,
        mean,
        std,
        train: bool,
        augmentation: Augmentation = Augmentation(),  # noqa: B008 (frozen: shared, never changed)
        seed: int = 0,
        drop_last: bool | None = None,
        out_size: int | None = None,
        rank: int = 0,
        world_size: int = 1,
    ):
        if images.dtype not in (torch.uint8, torch.float32) or images.ndim != 4:
            raise ValueError(
                f"images must be a uint8 or float32 (N, C, H, W) tensor, got {images.dtype} {tuple(images.shape)}"
            )
        a = augmentation
        auto_augment = a.batch_policy if train else None
        if images.is_floating_point() and auto_augment is not None:
            raise ValueError("auto_augment works on uint8 images (its tables cover 256 values); these are float32")
        self.images, self.targets = images, targets.to(images.device)
        self.batch_size, self.train = batch_size, train
        self.crop_padding, self.hflip, self.rot90 = a.crop_padding, a.hflip, a.rot90
        self.rrc_scale, self.auto_augment, self.erasing = a.rrc_scale, auto_augment, a.erasing
        self.seed, self.rank, self.world_size, self.out_size = seed, rank, world_size, out_size
        self.per_rank = -(-len(images) // world_size)  # every rank's share, padded
        self.drop_last = train and self.per_rank > batch_size if drop_last is None else drop_last
        self.scale, self.shift = uint8_affine(mean, std, images.device)  # ToDtype + Normalize as one multiply-add
        self.epoch = 0
        self._next = 0  # index of the next batch of this epoch to hand out
        self._resume_at = 0  # after load_state_dict: the batch to start the restored epoch at
        if train:  # Lightning calls `dataloader.sampler.set_epoch(epoch)` before every epoch (and on resume)
            self.sampler, self.batch_sampler = self, None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def state_dict(self) -> dict:
        """Where the epoch is, for a checkpoint saved mid-epoch (Lightning saves and restores stateful loaders)."""
        return {"epoch": self.epoch, "next": self._next}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self._resume_at = int(state["epoch"]), int(state["next"])

    def _positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's image indices for the epoch, (per_rank,), and which of them are padding, (per_rank,) bool."""
        n = len(self.images)
        if self.train:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(n, generator=g)
        else:
            order = torch.arange(n)
        total = self.per_rank * self.world_size
        padded = order.repeat(-(-total // n))[:total]  # the first images again, as often as it takes
        pad = torch.arange(total) >= n
        return padded[self.rank :: self.world_size], pad[self.rank :: self.world_size]

    def __len__(self) -> int:
        n = self.per_rank
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _draw(self, n: int) -> dict:
        """Every random choice of the epoch's augmentation, per image in epoch order, drawn at once: the per-batch
        draws were ~60 small operators a batch (0.6 ms of 8 for 256 CIFAR images on CPU). One generator per epoch,
        seeded by (seed, epoch, rank): same seed => same epoch, and a resumed epoch continues exactly."""
        if not self.train:
            return {}
        device = self.images.device
        g = torch.Generator(device=device).manual_seed(hash((self.seed, self.epoch, self.rank)) % 2**62)
        H, W = self.images.shape[-2:]
        draws = {}
        if self.rrc_scale is not None:
            draws["rrc"] = random_resized_crop_boxes(n, H, W, g, scale=self.rrc_scale, device=device)
            H = W  # the crop is resized to W x W
        if self.crop_padding > 0 or self.hflip:
            draws["crop"] = crop_flip_params(n, 0 if self.rrc_scale else self.crop_padding, self.hflip, g, device)
        if self.rot90:
            draws["turn"] = quarter_turn_params(n, g, device)
        if self.auto_augment is not None:
            draws["aug"] = self.auto_augment.draw(n, H, W, g, device)
        if self.erasing > 0:
            draws["erase"] = random_erasing_boxes(n, H, W, self.erasing, g, device=device)
        return draws

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order, pad = self._positions()
        order = order.to(self.images.device)
        padded = self.per_rank * self.world_size > len(self.images)
        ignore = pad.to(self.images.device) if padded and not self.train else None
        start, self._resume_at = self._resume_at, 0
        draws = self._draw(len(order))
        for b in range(start, len(self)):
            self._next = b + 1
            part = slice(b * self.batch_size, (b + 1) * self.batch_size)
            d = {
                k: tuple(t if t is None else t[part] for t in v) if isinstance(v, tuple) else v[part]
                for k, v in draws.items()
            }
            # index_select: 20x faster than images[idx] for a uint8 batch on CPU (0.017 vs 0.35 ms, 256 CIFAR images)
            x, y = self.images.index_select(0, order[part]), self.targets.index_select(0, order[part])
            if ignore is not None:  # evaluation padding: counted by no metric and no loss
                y = y.masked_fill(ignore[part], IGNORE)
            if "rrc" in d:
                x = resized_crop(x, d["rrc"], x.shape[-1])
            if "crop" in d:
                x = crop_flip(x, *d["crop"], 0 if self.rrc_scale else self.crop_padding)
            if "turn" in d:
                x = quarter_turn(x, d["turn"])
            if "aug" in d:
                x = self.auto_augment.apply(x, d["aug"])
            x = normalize_uint8(x, self.scale, self.shift)  # a new tensor: safe to change in place from here
            if "erase" in d:
                x = erase(x, d["erase"], inplace=True)
            if self.out_size and self.out_size != x.shape[-1]:
                x = F.interpolate(x, size=(self.out_size, self.out_size), mode="bilinear", align_corners=False)
            yield x, y
