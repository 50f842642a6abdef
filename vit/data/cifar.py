"""CIFAR-10/100 with CIFAR's training defaults: `torch/cifar10` / `torch/cifar100` of the torchvision DataModule
(vit/data/torchvision_data.py: one uint8 tensor in memory, augmented in batches on the training device), plus the
per-image torchvision transforms as a second path (`in_memory: false`)."""

from typing import Literal

from torchvision.transforms import v2

from vit.data.base import TensorImageDataset
from vit.data.cifar_files import CIFAR10_CLASSES, CIFAR100_CLASSES
from vit.data.torchvision_data import TorchvisionDataModule
from vit.data.transforms import AutoAugment, eval_transform, train_transform

__all__ = ["CIFAR10_CLASSES", "CIFAR100_CLASSES", "CIFARDataModule"]


class CIFARDataModule(TorchvisionDataModule):
    """CIFAR-10 or CIFAR-100 through torchvision, in `root` (downloaded there when the network allows). The official
    test set serves as validation. Training crops are padded crops (`crop_padding`), or with `crop_scale`
    RandomResizedCrop of that share of the area (what a planned recipe sets), with horizontal flips and AutoAugment's
    CIFAR-10 policy when `auto_augment` asks for a policy. `img_size` other than 32: the 32 px images stay in memory
    and are upsampled after augmentation (fine-tuning at 224 px holds 150 MB, not 7.5 GB). `in_memory: false`: the
    per-image torchvision transforms in `num_workers` loader workers instead of the batched augmentation. `mean`,
    `std`: the normalisation (None: CIFAR's published one; pretrained weights' own, set by `--model.init_from`)."""

    def __init__(
        self,
        dataset: Literal["cifar10", "cifar100"] = "cifar10",
        root: str = "data",
        download: bool = True,
        batch_size: int = 128,
        num_workers: int = 2,
        crop_padding: int = 4,
        hflip: bool = True,
        auto_augment: AutoAugment = "none",
        random_erasing: float = 0.0,
        in_memory: bool = True,
        img_size: int = 32,
        eval_batch_size: int | None = None,
        crop_scale: tuple[float, float] | None = None,
        rot90: bool = False,
        mean: tuple[float, ...] | None = None,
        std: tuple[float, ...] | None = None,
    ):
        if dataset not in ("cifar10", "cifar100"):
            raise ValueError(f"dataset={dataset!r} is not one of ['cifar10', 'cifar100']")
        if num_workers < 0:
            raise ValueError(f"num_workers={num_workers} must be >= 0")
        super().__init__(
            f"torch/{dataset}",
            root=root,
            download=download,
            img_size=img_size,
            batch_size=batch_size,
            eval_batch_size=eval_batch_size,
            crop_padding=crop_padding,
            hflip=hflip,
            auto_augment=auto_augment,
            autoaugment_policy="cifar10",
            random_erasing=random_erasing,
            crop_scale=crop_scale,
            rot90=rot90,
            mean=mean,
            std=std,
        )
        self.dataset = dataset
        self.num_workers, self.in_memory = num_workers, in_memory
        if not in_memory:  # per image, in loader workers: the reference the batched augmentation reproduces
            (train_x, train_y), (val_x, val_y) = self.memory["train"], self.memory["val"]
            train_tf = train_transform(32, self.mean, self.std, self.augmentation)  # autoaugment_policy: cifar10
            if self.img_size != 32:
                train_tf = v2.Compose([train_tf, v2.Resize(self.img_size, antialias=True)])
            self.train_set = TensorImageDataset(train_x, train_y, train_tf)
            self.val_set = TensorImageDataset(val_x, val_y, eval_transform(self.img_size, self.mean, self.std))
