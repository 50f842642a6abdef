"""What every DataModule shares: the loaders (in-memory batches on the device, or a DataLoader) and the facts
about the data that the model and predict need.

Each DataModule knows, from its constructor alone, what the model needs to be built and what predict needs to
preprocess an image the way training did: `num_classes`, `class_names`, `img_size`, `in_chans`, `mean`, `std`.
`train.py` links these into the LightningModule, which stores them in every checkpoint as plain types.
"""

import logging

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from vit.data.device import DeviceBatches
from vit.data.transforms import Augmentation

log = logging.getLogger(__name__)


class TensorImageDataset(Dataset):
    """Images held in memory as one uint8 tensor (N, C, H, W), transformed per item."""

    def __init__(self, images: torch.Tensor, targets: torch.Tensor, transform=None):
        self.images, self.targets, self.transform = images, targets, transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        img = self.images[i]
        return (self.transform(img) if self.transform else img), int(self.targets[i])


class ImageClassificationData(L.LightningDataModule):
    """Shared loaders and the facts about the data that the model and predict need."""

    num_classes: int
    class_names: list[str]
    task: str = "multiclass"  # or "multilabel": several labels an image, a (C,) 0/1 target each
    img_size: int
    in_chans: int = 3
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __init__(self, batch_size: int, num_workers: int, in_memory: bool = False, eval_batch_size: int | None = None):
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        if eval_batch_size is not None and eval_batch_size < 1:
            raise ValueError(f"eval_batch_size={eval_batch_size} must be >= 1")
        # No gradients in validation: bigger batches cost no more memory than training's and fewer steps (timm's
        # --validation-batch-size). None: batch_size.
        self.eval_batch_size = eval_batch_size or batch_size
        if num_workers < 0:
            raise ValueError(f"num_workers={num_workers} must be >= 0")
        self.batch_size, self.num_workers, self.in_memory = batch_size, num_workers, in_memory
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None  # a test split, where the data has one (scored, never used to choose)
        # For the in-memory path: {"train": (uint8 images, targets), "val": ...} and the augmentation to apply.
        self.memory: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        # the training split's augmentation (both paths draw the same), set by each DataModule from its flags
        self.augmentation = Augmentation()
        # {split: (N, C) class probabilities}: the training targets where the data gives probabilities (soft labels);
        # `memory` keeps the likeliest class, which validation, the metrics and the class counts read
        self.soft_targets: dict[str, torch.Tensor] = {}

    def _device_batches(self, split: str) -> DeviceBatches:
        trainer = self.trainer
        device = trainer.strategy.root_device if trainer is not None else torch.device("cpu")
        images, targets = self.memory[split]
        if images.device != device:  # once: the dataset then lives on the training device
            images, targets = images.to(device), targets.to(device)
            self.memory[split] = (images, targets)
        if split == "train" and "train" in self.soft_targets:
            targets = self.soft_targets["train"]  # (N, C): DeviceBatches moves it to the images' device
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        return DeviceBatches(
            images,
            targets,
            self.batch_size if split == "train" else self.eval_batch_size,
            self.mean,
            self.std,
            train=split == "train",
            augmentation=self.augmentation,
            out_size=self.img_size,
            seed=torch.initial_seed() % 2**31,
            rank=rank,
            world_size=world,
        )

    def _loader(self, dataset: Dataset, train: bool) -> DataLoader:
        # drop_last on train: Mixup needs even batches, and a ragged last batch would recompile a compiled model.
        return DataLoader(
            dataset,
            batch_size=self.batch_size if train else self.eval_batch_size,
            shuffle=train,
            drop_last=train and len(dataset) > self.batch_size,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),  # page-locked batches: the copy to the GPU does not block the host
        )

    def class_counts(self) -> list[int] | None:
        """Training images per class (the prior of the logit-adjusted loss), or None where the data cannot tell."""
        if "train" in self.memory:
            targets = self.memory["train"][1]
        elif self.train_set is not None and hasattr(self.train_set, "targets"):
            targets = torch.as_tensor(self.train_set.targets)
        else:
            return None
        if targets.ndim == 2:  # multi-label (N, C): images carrying each label
            return targets.cpu().sum(0).long().tolist()
        return torch.bincount(targets.cpu(), minlength=self.num_classes).tolist()

    def train_dataloader(self) -> DataLoader | DeviceBatches:
        return self._device_batches("train") if self.in_memory else self._loader(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader | DeviceBatches:
        return self._device_batches("val") if self.in_memory else self._loader(self.val_set, train=False)

    def test_dataloader(self) -> DataLoader | DeviceBatches:
        return self.val_dataloader()


def whole_val_batches(dm: ImageClassificationData, split: str = "val", limit: int | None = None):
    """The whole validation (or test) set in one process (after fit on rank zero, or in vit-eval), as training
    evaluated it: (normalised images, targets) batches. `limit`: at most that many of a set held in memory, chosen by
    class as whole_train_batches does."""
    if getattr(dm, "memory", None) and split in dm.memory:
        images, targets = dm.memory[split]
        if limit is not None and len(targets) > limit:
            keep = by_class_sample(targets, limit)
            images, targets = images[keep], targets[keep]
        return DeviceBatches(images, targets, dm.eval_batch_size, dm.mean, dm.std, train=False, out_size=dm.img_size)
    if getattr(dm, f"{split}_set", None) is not None:
        return DataLoader(getattr(dm, f"{split}_set"), batch_size=dm.eval_batch_size, num_workers=dm.num_workers)
    return dm.val_dataloader() if split == "val" else dm.test_dataloader()  # litdata streams: its own loader


def whole_train_batches(dm: ImageClassificationData, limit: int | None = None, seed: int = 0) -> DeviceBatches | None:
    """The training images without augmentation, as validation sees images (after fit: the statistics that tell
    training-like images from others, vit/evaluation/unknown.py); None where they are not held in memory (a stream).
    `limit`: at most that many, chosen by class (an equal share of each class, every image of a smaller class;
    seeded), so that the pass after fit costs a bounded share of a short run."""
    if not (getattr(dm, "memory", None) and "train" in dm.memory):
        return None
    images, targets = dm.memory["train"]
    if limit is not None and len(targets) > limit:
        keep = by_class_sample(targets, limit, seed)
        images, targets = images[keep], targets[keep]
    return DeviceBatches(images, targets, dm.eval_batch_size, dm.mean, dm.std, train=False, out_size=dm.img_size)


def by_class_sample(targets: torch.Tensor, limit: int, seed: int = 0) -> torch.Tensor:
    """Indices (sorted) of at most `limit` items, as evenly over the classes as they allow: each class gives
    min(its count, a share), the share raised until `limit` is reached; which items of a class, a seeded draw.
    `targets`: (N,) class indices, or (N, C) scores (soft or multi-label: the largest)."""
    classes = targets.argmax(-1) if targets.ndim > 1 else targets
    gen = torch.Generator().manual_seed(seed)
    groups = [torch.nonzero(classes == c).flatten() for c in torch.unique(classes)]
    groups = [g[torch.randperm(len(g), generator=gen)] for g in groups]
    counts = sorted(len(g) for g in groups)
    share, left, n = 0, limit, len(groups)
    for i, c in enumerate(counts):  # water-filling: small classes whole, the rest an equal share
        if c * (n - i) >= left:
            share = left // (n - i)
            break
        left -= c
    else:
        share = counts[-1]
    keep = torch.cat([g[: max(share, 0)] if len(g) > share else g for g in groups])
    return keep.sort().values


def rounded(values) -> tuple[float, ...]:
    """Measured statistics to 5 significant digits (readable in a config, exact enough: 4 decimals put 12-bit data's
    mean, near 0.02, 0.5% off)."""
    return tuple(float(f"{v:.5g}") for v in values)


def channel_mean_std(x: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and (unbiased) std of images (N, C, H, W) in [0, 1] (uint8 / 255, or float as stored), in
    float64 chunks: no float copy of the whole set (4x the uint8 tensor)."""
    total = torch.zeros(x.shape[1], dtype=torch.float64)
    squares = torch.zeros(x.shape[1], dtype=torch.float64)
    for i in range(0, len(x), chunk):
        part = x[i : i + chunk].double().div_(255 if x.dtype == torch.uint8 else 1)
        total += part.sum(dim=(0, 2, 3))
        squares += part.square().sum(dim=(0, 2, 3))
    n = x.shape[0] * x.shape[2] * x.shape[3]
    mean = total / n
    var = (squares - n * mean.square()) / max(1, n - 1)
    return mean.float(), var.clamp(min=0).sqrt().float().clamp(min=1e-3)  # a constant channel must not divide by 0


def given_mean_std(
    mean: tuple[float, ...] | None, std: tuple[float, ...] | None, in_chans: int, own: tuple[tuple, tuple]
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The normalisation a DataModule was given (pretrained weights' own: vit/run/weights.py), fitted to its
    channels, or `own` (the data's) where none was given. Grey images from RGB statistics take their average: timm's
    adapt_input_conv sums the RGB kernels, so a grey image stands for three equal channels."""
    if mean is None or std is None:
        return own
    fitted = []
    for name, values in (("mean", mean), ("std", std)):
        values = tuple(float(v) for v in values)
        if len(values) == in_chans:
            fitted.append(values)
        elif len(values) == 3 and in_chans == 1:
            fitted.append((sum(values) / 3,))
        elif len(values) == 1:
            fitted.append(values * in_chans)
        else:
            raise ValueError(f"{name}={list(values)}: {len(values)} values for {in_chans}-channel images")
    return fitted[0], fitted[1]
