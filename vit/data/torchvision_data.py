"""Any torchvision classification dataset by name, timm's convention: `--data.init_args.dataset torch/mnist`.

    python train.py --config configs/mnist.yaml                           # torch/mnist, 1 channel
    python train.py --config configs/mnist.yaml --data.init_args.dataset torch/kmnist
    python train.py --config configs/mnist.yaml --data.init_args.dataset torch/svhn --data.init_args.img_size 32

The dataset is downloaded into `root` when the network allows; offline, one line says which files to put where. The
whole split is held once as a uint8 tensor (the in-memory path: augmentation batched on the training device): at
img_size when its images are larger, at their own size when smaller, upsampled on the device after augmentation
(CIFAR at 224 px: 150 MB instead of 7.5 GB). Grayscale datasets train as one channel (`in_chans` 1, linked to the
model) or, with `to_rgb`, replicated to three. Mean and std are the published ones where torchvision's datasets have
them (CIFAR), else measured on the training split and cached in `root/<name>_stats.json`.
"""

import json
import os
import time
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torchvision import datasets

from vit.data.base import ImageClassificationData, TensorImageDataset, channel_mean_std, given_mean_std
from vit.data.cifar_files import CIFAR10_MEAN, CIFAR10_STD, CIFAR100_MEAN, CIFAR100_STD, open_cifar
from vit.data.files import TRAIN_DIRS, VAL_DIRS, first_idx_problem
from vit.data.folder import decode_images
from vit.data.transforms import Augmentation, AutoAugment, DataError, check_crop_scale, to_normalized

# name -> (torchvision class, how to ask for the training and the validation split). The names are timm's
# (timm.data.dataset_factory: cifar10, cifar100, mnist, kmnist, fashion_mnist, qmnist, inaturalist, places365,
# imagenet, image_folder), so a timm command line's `torch/<name>` works here; ALIASES keeps older spellings.
SPLIT_BY_TRAIN = ({"train": True}, {"train": False})
SPLIT_BY_NAME = ({"split": "train"}, {"split": "test"})
KNOWN = {
    "mnist": ("MNIST", SPLIT_BY_TRAIN),
    "fashion_mnist": ("FashionMNIST", SPLIT_BY_TRAIN),
    "kmnist": ("KMNIST", SPLIT_BY_TRAIN),
    "qmnist": ("QMNIST", SPLIT_BY_TRAIN),
    "cifar10": ("CIFAR10", SPLIT_BY_TRAIN),
    "cifar100": ("CIFAR100", SPLIT_BY_TRAIN),
    "inaturalist": ("INaturalist", ({"version": "2021_train"}, {"version": "2021_valid"})),
    "places365": ("Places365", ({"split": "train-standard"}, {"split": "val"})),
    "imagenet": ("ImageNet", ({"split": "train"}, {"split": "val"})),
    "image_folder": ("ImageFolder", None),
    "svhn": ("SVHN", SPLIT_BY_NAME),
    "stl10": ("STL10", SPLIT_BY_NAME),
    "food101": ("Food101", SPLIT_BY_NAME),
    "flowers102": ("Flowers102", ({"split": "train"}, {"split": "val"})),
    "dtd": ("DTD", ({"split": "train"}, {"split": "val"})),
    "gtsrb": ("GTSRB", SPLIT_BY_NAME),
    "eurosat": ("EuroSAT", None),
}
ALIASES = {"fashionmnist": "fashion_mnist", "inat": "inaturalist", "folder": "image_folder"}
NO_DOWNLOAD = ("ImageNet", "ImageFolder")  # torchvision cannot fetch these: the files must be there


def resolve(dataset: str) -> tuple[str, type, tuple[dict, dict] | None]:
    """`torch/<name>` -> (canonical name, torchvision class, split arguments or None for the train/test default).
    One-line ValueError for anything else."""
    if not dataset.startswith("torch/"):
        raise ValueError(f"dataset={dataset!r}: torchvision datasets are named torch/<name>, e.g. torch/mnist")
    name = dataset.split("/", 1)[1]
    key = ALIASES.get(name.lower(), name.lower())
    cls_name, splits = KNOWN.get(key, (name, None))
    cls = getattr(datasets, cls_name, None)
    if cls is None or not isinstance(cls, type):
        raise ValueError(f"dataset={dataset!r}: torchvision.datasets has no {cls_name}; known: {sorted(KNOWN)}")
    return (key if key in KNOWN else name.lower()), cls, splits


PUBLISHED = {"cifar10": (CIFAR10_MEAN, CIFAR10_STD), "cifar100": (CIFAR100_MEAN, CIFAR100_STD)}
# Under torchrun every process builds its DataModule at once: only local rank 0 downloads (two downloads into one
# folder corrupt it), the others wait this long at most for its files. Lightning's own launcher starts the other
# ranks after rank 0 has built its DataModule: they find the files.
DOWNLOAD_WAIT_S, DOWNLOAD_POLL_S = 1800.0, 1.0


def where_files_go(cls, root: Path) -> str:
    """Which files a torchvision dataset class reads, and where, for the offline message."""
    if hasattr(cls, "resources") and cls.__name__.endswith("MNIST"):  # MNIST, FashionMNIST, KMNIST, QMNIST: idx
        resources = cls.resources
        if isinstance(resources, dict):  # QMNIST: per split
            resources = [r for split in ("train", "test") for r in resources[split]]
        names = ", ".join(Path(url).name for url, _ in resources)
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


def _files(ds) -> tuple[list[str], list[int]]:
    """(paths, targets) of a file-backed torchvision dataset, read from its index without opening an image; empty
    lists for an in-memory one."""
    for name in ("samples", "_samples", "imgs"):  # ImageFolder/ImageNet, GTSRB, Places365: (path, target) pairs
        pairs = getattr(ds, name, None)
        if isinstance(pairs, list) and pairs and isinstance(pairs[0], tuple):
            return [str(p) for p, _ in pairs], [int(t) for _, t in pairs]
    if isinstance(ds, datasets.INaturalist):  # index: (category id, file name) under root/<category folder>/
        return [os.path.join(ds.root, ds.all_categories[c], f) for c, f in ds.index], [c for c, _ in ds.index]
    files = [str(p) for p in getattr(ds, "_image_files", [])]  # Food101, Flowers102, DTD, ...: labels beside
    return files, [int(t) for t in getattr(ds, "_labels", [])][: len(files)]


def _targets(ds) -> torch.Tensor:
    for name in ("targets", "labels", "_labels"):
        if hasattr(ds, name):
            t = torch.as_tensor(getattr(ds, name), dtype=torch.long)
            return t[:, 0] if t.ndim == 2 else t  # QMNIST: (N, 8) records, the class first
    _, targets = _files(ds)
    if targets:
        return torch.tensor(targets, dtype=torch.long)
    return torch.tensor([ds[i][1] for i in range(len(ds))], dtype=torch.long)


class TorchvisionDataModule(ImageClassificationData):
    """A torchvision classification dataset by name (`torch/<name>`), trained through the in-memory path.

    Args:
        dataset: `torch/<name>`: timm's names (mnist, fashion_mnist, kmnist, qmnist, cifar10, cifar100, inaturalist,
            places365, imagenet, image_folder) and svhn, stl10, food101, flowers102, dtd, gtsrb, eurosat; or
            `torch/<ClassName>` of any other torchvision dataset taking `train=` or `split=`.
        img_size: training resolution; None: the dataset's own size (28 MNIST, 32 CIFAR/SVHN, 96 STL10). Images of
            other sizes are resized (shorter side) and centre-cropped once, when decoded.
        to_rgb: replicate a grayscale dataset to 3 channels instead of training on 1.
        crop_padding, hflip, auto_augment, random_erasing: training augmentation (hflip off by default: digits and
            text are not mirror-symmetric); rot90: random quarter turns (square images).
        crop_scale: RandomResizedCrop of this share of the area instead of the padded crop (a planned recipe's).
        mean, std: the normalisation; None: the dataset's (published, or measured once). `--model.init_from` sets the
            weights' own.
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
        crop_scale: tuple[float, float] | None = None,
        rot90: bool = False,
        mean: tuple[float, ...] | None = None,
        std: tuple[float, ...] | None = None,
    ):
        super().__init__(batch_size, num_workers=0, in_memory=True, eval_batch_size=eval_batch_size)
        rrc_scale = check_crop_scale(crop_scale)
        if img_size is not None and img_size < 1:
            raise ValueError(f"img_size={img_size} must be >= 1")
        if not 0.0 <= random_erasing <= 1.0:
            raise ValueError(f"random_erasing={random_erasing} must be a probability in [0, 1]")
        self.name, cls, splits = resolve(dataset)
        self.root = Path(root)
        train_ds, val_ds = (self._open(cls, kwargs, download) for kwargs in (splits or SPLIT_BY_TRAIN))
        train_x, val_x = self._decode(train_ds, img_size), self._decode(val_ds, img_size)
        if not to_rgb and train_x.shape[1] == 1:
            self.in_chans = 1
        else:
            train_x, val_x = train_x.expand(-1, 3, -1, -1).contiguous(), val_x.expand(-1, 3, -1, -1).contiguous()
            self.in_chans = 3
        self.img_size = img_size or train_x.shape[-1]  # smaller images are upsampled after augmentation (out_size)
        train_y, val_y = _targets(train_ds), _targets(val_ds)
        classes = getattr(train_ds, "classes", None) or getattr(train_ds, "all_categories", None)
        classes = classes or [str(i) for i in range(int(train_y.max()) + 1)]
        # ImageNet's classes are tuples of synonyms: the first names the class
        self.class_names = [str(c[0] if isinstance(c, tuple) else c) for c in classes]
        self.num_classes = len(classes)
        own = self._stats(train_x) if mean is None or std is None else None  # not measured when given
        self.mean, self.std = given_mean_std(mean, std, self.in_chans, own)
        self.memory = {"train": (train_x, train_y), "val": (val_x, val_y)}
        self.augmentation = Augmentation(
            crop_padding=crop_padding,
            hflip=hflip,
            rot90=rot90,
            rrc_scale=rrc_scale,
            auto_augment=auto_augment,
            autoaugment_policy=autoaugment_policy,
            erasing=random_erasing,
        )
        to_float = to_normalized(self.mean, self.std)
        self.train_set = TensorImageDataset(train_x, train_y, to_float)  # per-item views; the loaders use the tensors
        self.val_set = TensorImageDataset(val_x, val_y, to_float)

    def _open(self, cls, kwargs: dict, download: bool):
        if not download or int(os.environ.get("LOCAL_RANK", 0)) == 0:
            return open_split(self.name, cls, kwargs, self.root, download)
        deadline = time.monotonic() + DOWNLOAD_WAIT_S  # another local rank: local rank 0 downloads (DOWNLOAD_WAIT_S)
        while True:
            try:
                return open_split(self.name, cls, kwargs, self.root, download=False)
            except DataError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(DOWNLOAD_POLL_S)

    def _decode(self, ds, img_size: int | None) -> torch.Tensor:
        return decode_split(ds, img_size, self.name)

    def _stats(self, train_x: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Published mean/std, or measured on the training split once and cached beside the data."""
        if self.name in PUBLISHED and train_x.shape[1] == 3:
            return PUBLISHED[self.name]
        cache = self.root / f"{self.name}_stats.json"
        key = f"{tuple(train_x.shape)}"
        stats = json.loads(cache.read_text()) if cache.is_file() else {}
        if key not in stats:
            mean, std = channel_mean_std(train_x)  # in chunks: no float copy of the whole set
            mean, std = [round(v, 4) for v in mean.tolist()], [round(v, 4) for v in std.tolist()]
            stats[key] = [mean, std]
            try:
                cache.write_text(json.dumps(stats, indent=1) + "\n")
            except OSError:  # a read-only data folder: measured again next time
                pass
        mean, std = stats[key]
        return tuple(mean), tuple(std)


def open_split(name: str, cls, kwargs: dict, root: Path, download: bool):
    """One split of a torchvision dataset (`kwargs`: its train/split arguments), or a DataError naming the files."""
    if name in PUBLISHED:  # CIFAR: its files checked, a broken one named (vit/data/cifar_files.py)
        return open_cifar(name, str(root), bool(kwargs.get("train")), download=download)
    try:
        if cls is datasets.ImageFolder:  # timm's torch/image_folder: root/train/<class>/*, root/val/<class>/*
            names = TRAIN_DIRS if kwargs.get("train") else VAL_DIRS
            folder = next((root / d for d in names if (root / d).is_dir()), None)
            if folder is None:
                raise DataError(f"torch/{name}: {root}/ has none of the folders {list(names)}")
            return cls(str(folder))
        if cls.__name__ in NO_DOWNLOAD:
            return cls(str(root), **kwargs)
        return cls(str(root), download=download, **kwargs)
    except (AssertionError, KeyError, ValueError, TypeError, IndexError, EOFError, OSError, RuntimeError) as e:
        # Files that are there but not in the layout torchvision reads (an idx file of another kind, truncated)
        # are named; otherwise the files are missing (URLError is an OSError; torchvision raises RuntimeError).
        if isinstance(e, DataError):
            raise
        problem = first_idx_problem(root / cls.__name__)  # torchvision keeps each set in root/<Class>/
        if problem:
            raise DataError(problem) from None
        if not isinstance(e, (OSError, RuntimeError)):
            raise DataError(f"torch/{name} in {root}/: unreadable ({type(e).__name__}: {e})") from None
        reason = " ".join((str(getattr(e, "reason", "") or e)).split())[:120]
        raise DataError(
            f"torch/{name} not found in {root}/ and not downloadable ({reason}): "
            f"{where_files_go(cls, root)} and run again"
        ) from None


def decode_split(ds, img_size: int | None, name: str) -> torch.Tensor:
    """A split as one uint8 (N, C, S, S) tensor: image files decoded at img_size; a dataset held as arrays at its own
    size, or at img_size when that is smaller (None: its own size). Smaller images are upsampled after augmentation,
    on the device (DeviceBatches' out_size): padding and crops act on the pixels the images have."""
    try:
        x = _uint8_images(ds)
    except TypeError:  # file-backed: decode every image once, in threads, at img_size
        paths = _files(ds)[0]
        if not paths or img_size is None:
            raise ValueError(f"dataset=torch/{name}: give --data.init_args.img_size") from None
        images, bad = decode_images(paths, img_size)
        if bad:
            raise DataError(f"{bad[0][0]}: {bad[0][1]} (and {len(bad) - 1} more)") from None
        return torch.stack(images)
    if img_size is not None and x.shape[-1] > img_size:
        x = F.interpolate(x.float(), size=(img_size, img_size), mode="bilinear", antialias=True)
        x = x.round_().clamp_(0, 255).to(torch.uint8)
    return x


def eval_split(dataset: str, root: str, img_size: int, in_chans: int) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """The evaluation split of `torch/<name>` (its test split, or val where it has no test split), decoded as
    training decodes it for a checkpoint's img_size and channels: (uint8 (N, in_chans, S, S), targets, class names);
    S is below img_size where training upsampled after augmentation (batch it with out_size=img_size). Nothing is
    downloaded."""
    name, cls, splits = resolve(dataset)
    ds = open_split(name, cls, (splits or SPLIT_BY_TRAIN)[1], Path(root), download=False)
    x = decode_split(ds, img_size, name)
    if x.shape[1] != in_chans:
        x = x.expand(-1, 3, -1, -1).contiguous() if x.shape[1] == 1 else x[:, :in_chans]
    classes = getattr(ds, "classes", None) or getattr(ds, "all_categories", None) or []
    return x, _targets(ds), [str(c[0] if isinstance(c, tuple) else c) for c in classes]
