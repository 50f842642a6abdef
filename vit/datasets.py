"""Any torchvision classification dataset by name, timm's convention: `--data.init_args.dataset torch/mnist`.

    python train.py --config configs/mnist.yaml                           # torch/mnist, 1 channel
    python train.py --config configs/mnist.yaml --data.init_args.dataset torch/kmnist
    python train.py --config configs/mnist.yaml --data.init_args.dataset torch/svhn --data.init_args.img_size 32

The dataset is downloaded into `root` when the network allows; offline, one line says which files to put where. The
whole split is decoded once into a uint8 tensor at img_size (the in-memory path: augmentation batched on the
training device). Grayscale datasets train as one channel (`in_chans` 1, linked to the model) or, with `to_rgb`,
replicated to three. Mean and std are the published ones where torchvision's datasets have them (CIFAR), else
measured on the training split and cached in `root/<name>_stats.json`.
"""

import json
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torchvision import datasets
from torchvision.transforms import v2

from vit.data import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    CIFAR100_MEAN,
    CIFAR100_STD,
    AutoAugment,
    DataError,
    ImageClassificationData,
    TensorImageDataset,
    batch_policy,
    decode_images,
)

# name -> (torchvision class, how to ask for the training and the validation split)
SPLIT_BY_TRAIN = ({"train": True}, {"train": False})
SPLIT_BY_NAME = ({"split": "train"}, {"split": "test"})
KNOWN = {
    "mnist": ("MNIST", SPLIT_BY_TRAIN),
    "fashionmnist": ("FashionMNIST", SPLIT_BY_TRAIN),
    "kmnist": ("KMNIST", SPLIT_BY_TRAIN),
    "cifar10": ("CIFAR10", SPLIT_BY_TRAIN),
    "cifar100": ("CIFAR100", SPLIT_BY_TRAIN),
    "svhn": ("SVHN", SPLIT_BY_NAME),
    "stl10": ("STL10", SPLIT_BY_NAME),
    "food101": ("Food101", SPLIT_BY_NAME),
    "flowers102": ("Flowers102", ({"split": "train"}, {"split": "val"})),
    "dtd": ("DTD", ({"split": "train"}, {"split": "val"})),
    "gtsrb": ("GTSRB", SPLIT_BY_NAME),
    "eurosat": ("EuroSAT", None),
}
PUBLISHED = {"cifar10": (CIFAR10_MEAN, CIFAR10_STD), "cifar100": (CIFAR100_MEAN, CIFAR100_STD)}


def where_files_go(cls, root: Path) -> str:
    """Which files a torchvision dataset class reads, and where, for the offline message."""
    if hasattr(cls, "resources") and cls.__name__.endswith("MNIST"):  # MNIST, FashionMNIST, KMNIST: idx files
        names = ", ".join(Path(url).name for url, _ in cls.resources)
        return f"put {names} in {root / cls.__name__ / 'raw'}/"
    if cls is datasets.SVHN:
        return (
            f"put train_32x32.mat and test_32x32.mat (from {cls.split_list['train'][0].rsplit('/', 1)[0]}/) in {root}/"
        )
    if hasattr(cls, "filename") and hasattr(cls, "url"):  # CIFAR, STL10: one archive
        return f"put {cls.filename} (from {cls.url.rsplit('/', 1)[0]}/) in {root}/"
    return f"put the files that torchvision.datasets.{cls.__name__} expects under {root}/"


def _uint8_images(ds) -> torch.Tensor:
    """The split as (N, C, H, W) uint8: torchvision's own arrays where it keeps them, else decoded in threads."""
    data = getattr(ds, "data", None)
    if isinstance(data, torch.Tensor) and data.ndim == 3:  # MNIST family: (N, H, W) uint8 tensor
        return data[:, None].contiguous()
    if data is not None and getattr(data, "ndim", 0) == 4:
        x = torch.as_tensor(data)
        return x.permute(0, 3, 1, 2).contiguous() if x.shape[-1] in (1, 3) else x.contiguous()  # CIFAR is NHWC
    raise TypeError  # a file-backed dataset: decoded by the caller


def _targets(ds) -> torch.Tensor:
    for name in ("targets", "labels", "_labels"):
        if hasattr(ds, name):
            return torch.as_tensor(getattr(ds, name), dtype=torch.long)
    return torch.tensor([ds[i][1] for i in range(len(ds))], dtype=torch.long)


class TorchvisionDataModule(ImageClassificationData):
    """A torchvision classification dataset by name (`torch/<name>`), trained through the in-memory path.

    Args:
        dataset: `torch/<name>`: mnist, fashionmnist, kmnist, cifar10, cifar100, svhn, stl10, food101, flowers102,
            dtd, gtsrb, eurosat; or `torch/<ClassName>` of any other torchvision dataset taking `train=` or `split=`.
        img_size: training resolution; None: the dataset's own size (28 MNIST, 32 CIFAR/SVHN, 96 STL10). Images of
            other sizes are resized (shorter side) and centre-cropped once, when decoded.
        to_rgb: replicate a grayscale dataset to 3 channels instead of training on 1.
        crop_padding, hflip, auto_augment, random_erasing: training augmentation (hflip off by default: digits and
            text are not mirror-symmetric).
    """

    def __init__(
        self,
        dataset: str = "torch/mnist",
        root: str = "data",
        download: bool = True,
        img_size: int | None = None,
        to_rgb: bool = False,
        batch_size: int = 128,
        eval_batch_size: int | None = None,
        crop_padding: int = 2,
        hflip: bool = False,
        auto_augment: AutoAugment = "none",
        autoaugment_policy: Literal["imagenet", "cifar10", "svhn"] = "imagenet",
        random_erasing: float = 0.0,
    ):
        super().__init__(batch_size, num_workers=0, in_memory=True, eval_batch_size=eval_batch_size)
        if not dataset.startswith("torch/"):
            raise ValueError(f"dataset={dataset!r}: torchvision datasets are named torch/<name>, e.g. torch/mnist")
        name = dataset.split("/", 1)[1]
        cls_name, splits = KNOWN.get(name.lower(), (name, None))
        cls = getattr(datasets, cls_name, None)
        if cls is None or not isinstance(cls, type):
            raise ValueError(f"dataset={dataset!r}: torchvision.datasets has no {cls_name}; known: {sorted(KNOWN)}")
        self.name, self.root = name.lower(), Path(root)
        train_ds, val_ds = (self._open(cls, kwargs, download) for kwargs in (splits or SPLIT_BY_TRAIN))
        train_x, val_x = self._decode(train_ds, img_size), self._decode(val_ds, img_size)
        if not to_rgb and train_x.shape[1] == 1:
            self.in_chans = 1
        else:
            train_x, val_x = train_x.expand(-1, 3, -1, -1).contiguous(), val_x.expand(-1, 3, -1, -1).contiguous()
            self.in_chans = 3
        self.img_size = train_x.shape[-1]
        train_y, val_y = _targets(train_ds), _targets(val_ds)
        classes = getattr(train_ds, "classes", None) or [str(i) for i in range(int(train_y.max()) + 1)]
        self.class_names, self.num_classes = [str(c) for c in classes], len(classes)
        self.mean, self.std = self._stats(train_x)
        self.memory = {"train": (train_x, train_y), "val": (val_x, val_y)}
        self.crop_padding, self.hflip, self.erasing = crop_padding, hflip, random_erasing
        self.auto_augment = batch_policy(auto_augment, autoaugment_policy)
        to_float = v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(self.mean, self.std)])
        self.train_set = TensorImageDataset(train_x, train_y, to_float)  # per-item views; the loaders use the tensors
        self.val_set = TensorImageDataset(val_x, val_y, to_float)

    def _open(self, cls, kwargs: dict, download: bool):
        try:
            return cls(str(self.root), download=download, **kwargs)
        except (OSError, RuntimeError) as e:  # URLError is an OSError; torchvision raises RuntimeError if absent
            reason = " ".join((str(getattr(e, "reason", "") or e)).split())[:120]
            raise DataError(
                f"torch/{self.name} not found in {self.root}/ and not downloadable ({reason}): "
                f"{where_files_go(cls, self.root)} and run again"
            ) from None

    def _decode(self, ds, img_size: int | None) -> torch.Tensor:
        try:
            x = _uint8_images(ds)
        except TypeError:  # file-backed: decode every image once, in threads, at img_size
            paths = [str(p) for p in getattr(ds, "_image_files", [])] or None
            if paths is None or img_size is None:
                raise ValueError(f"dataset=torch/{self.name}: give --data.init_args.img_size") from None
            images, bad = decode_images(paths, img_size)
            if bad:
                raise DataError(f"{bad[0][0]}: {bad[0][1]} (and {len(bad) - 1} more)") from None
            return torch.stack(images)
        if img_size is not None and x.shape[-1] != img_size:
            x = F.interpolate(x.float(), size=(img_size, img_size), mode="bilinear", antialias=True)
            x = x.round_().clamp_(0, 255).to(torch.uint8)
        return x

    def _stats(self, train_x: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Published mean/std, or measured on the training split once and cached beside the data."""
        if self.name in PUBLISHED and train_x.shape[1] == 3:
            return PUBLISHED[self.name]
        cache = self.root / f"{self.name}_stats.json"
        key = f"{tuple(train_x.shape)}"
        stats = json.loads(cache.read_text()) if cache.is_file() else {}
        if key not in stats:
            x = train_x.float().div_(255)
            mean = [round(v, 4) for v in x.mean(dim=(0, 2, 3)).tolist()]
            std = [round(v, 4) for v in x.std(dim=(0, 2, 3)).clamp(min=1e-3).tolist()]
            stats[key] = [mean, std]
            try:
                cache.write_text(json.dumps(stats, indent=1) + "\n")
            except OSError:  # a read-only data folder: measured again next time
                pass
        mean, std = stats[key]
        return tuple(mean), tuple(std)
