"""DataModules: CIFAR-10/100 (torchvision), a folder of your own images, and the built-in offline `digits` set.

Each DataModule knows, from its constructor alone, what the model needs to be built and what predict needs to
preprocess an image the way training did: `num_classes`, `class_names`, `img_size`, `in_chans`, `mean`, `std`.
`train.py` links these into the LightningModule, which stores them in every checkpoint as plain types.
"""

import logging
import os
import pickle
import time
from functools import partial
from pathlib import Path
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, Dataset
from torchvision import datasets
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes
from torchvision.transforms import v2

from vit.augment import BatchAutoAugment
from vit.dataset_files import cifar_problem
from vit.device_data import DeviceBatches
from vit.images import describe, eval_geometry, load_image, read_image

log = logging.getLogger(__name__)
AutoAugment = Literal["none", "randaugment", "trivialaugment", "autoaugment"]

CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
CIFAR100_CLASSES = """apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly
camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur dolphin
elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard lobster man
maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck pine_tree plain
plate poppy porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk skyscraper snail snake
spider squirrel streetcar sunflower sweet_pepper table tank telephone television tiger tractor train trout tulip turtle
wardrobe whale willow_tree wolf woman worm""".split()


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


def train_transform(
    img_size: int,
    mean,
    std,
    crop_padding: int = 4,
    hflip: bool = True,
    auto_augment: AutoAugment = "none",
    random_resized_crop: bool = False,
    autoaugment_policy: v2.AutoAugmentPolicy = v2.AutoAugmentPolicy.IMAGENET,
    random_erasing: float = 0.0,
    crop_scale: tuple[float, float] = (0.35, 1.0),
    rot90: bool = False,
) -> v2.Compose:
    """Training augmentation for a PIL image or a uint8 (C, H, W) tensor -> normalised float tensor. The reference
    that the batched in-memory path (vit.device_data, vit.augment) reproduces, drawing per image.
    `random_resized_crop`: RandomResizedCrop of `crop_scale` of the area instead of the padded crop; `rot90`: a random
    quarter turn (with `hflip`: the 8 symmetries of the square)."""
    if random_resized_crop:
        ops = [v2.RandomResizedCrop(img_size, scale=tuple(crop_scale), antialias=True)]
    else:
        ops = [v2.RandomCrop(img_size, padding=crop_padding)] if crop_padding else []
    if hflip:
        ops.append(v2.RandomHorizontalFlip())
    if auto_augment != "none":
        ops.append(augment_policy(auto_augment, autoaugment_policy))
    tail = [v2.RandomErasing(random_erasing, value=0)] if random_erasing > 0 else []
    turn = [RandomQuarterTurn()] if rot90 else []
    return v2.Compose(
        [*ops, v2.ToImage(), *turn, v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std), *tail]
    )


class RandomQuarterTurn(torch.nn.Module):
    """Turn a square (C, H, W) image tensor 0-3 quarter turns, each equally likely (torchvision has no such transform;
    RandomRotation resamples). The reference of the in-memory path's vit.crops.quarter_turn."""

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
    """The batched form (vit.augment) of augment_policy's torchvision policy: 'autoaugment' takes the dataset's
    policy ('imagenet', 'cifar10', 'svhn')."""
    if name == "none":
        return None
    augment_policy(name)  # the same one-line error for an unknown name
    return BatchAutoAugment(f"autoaugment_{autoaugment_policy}" if name == "autoaugment" else name)


def eval_transform(img_size: int, mean, std) -> v2.Compose:
    """Evaluation and predict preprocessing: eval_geometry, then scale to [0, 1] and normalise."""
    return v2.Compose([eval_geometry(img_size), v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])


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
        # For the in-memory path: {"train": (uint8 images, targets), "val": ...} and the augmentation to apply.
        self.memory: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        # augmentation of the in-memory path (vit.device_data), set by each DataModule
        self.crop_padding, self.hflip, self.rrc_scale, self.auto_augment, self.erasing = 0, False, None, None, 0.0
        self.rot90 = False

    def _device_batches(self, split: str) -> DeviceBatches:
        trainer = self.trainer
        device = trainer.strategy.root_device if trainer is not None else torch.device("cpu")
        images, targets = self.memory[split]
        if images.device != device:  # once: the dataset then lives on the training device
            images, targets = images.to(device), targets.to(device)
            self.memory[split] = (images, targets)
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        return DeviceBatches(
            images,
            targets,
            self.batch_size if split == "train" else self.eval_batch_size,
            self.mean,
            self.std,
            train=split == "train",
            crop_padding=self.crop_padding,
            hflip=self.hflip,
            rot90=self.rot90,
            rrc_scale=self.rrc_scale,
            auto_augment=self.auto_augment,
            erasing=self.erasing,
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
        return torch.bincount(targets.cpu(), minlength=self.num_classes).tolist()

    def train_dataloader(self) -> DataLoader | DeviceBatches:
        return self._device_batches("train") if self.in_memory else self._loader(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader | DeviceBatches:
        return self._device_batches("val") if self.in_memory else self._loader(self.val_set, train=False)

    def test_dataloader(self) -> DataLoader | DeviceBatches:
        return self.val_dataloader()


def whole_val_batches(dm: ImageClassificationData):
    """The whole validation set in one process (after fit on rank zero, or in vit-eval), as training evaluated it:
    (normalised images, targets) batches."""
    if getattr(dm, "memory", None) and "val" in dm.memory:
        images, targets = dm.memory["val"]
        return DeviceBatches(images, targets, dm.eval_batch_size, dm.mean, dm.std, train=False, out_size=dm.img_size)
    if getattr(dm, "val_set", None) is not None:
        return DataLoader(dm.val_set, batch_size=dm.eval_batch_size, num_workers=dm.num_workers)
    return dm.val_dataloader()  # litdata streams: its own loader


class DigitsDataModule(ImageClassificationData):
    """scikit-learn's 1,797 real 8x8 handwritten digits (shipped inside the package: works offline), upscaled to
    img_size x img_size RGB. A fixed train/val split by `split_seed`; random-crop augmentation, no flip (a flipped
    digit is another glyph). `in_memory` (default) batches and augments on the training device (vit.device_data);
    off, a DataLoader with per-image torchvision transforms does the same."""

    def __init__(
        self,
        img_size: int = 32,
        val_size: int = 360,
        split_seed: int = 0,
        batch_size: int = 64,
        num_workers: int = 0,
        crop_padding: int = 4,
        in_memory: bool = True,
        eval_batch_size: int | None = None,
    ):
        super().__init__(batch_size, num_workers, in_memory, eval_batch_size)
        from sklearn.datasets import load_digits

        digits = load_digits()
        if not 0 < val_size < len(digits.target):
            raise ValueError(f"val_size={val_size} must be between 1 and {len(digits.target) - 1}")
        x = torch.from_numpy(digits.images).float()[:, None] / 16.0  # (N, 1, 8, 8) in [0, 1]
        x = F.interpolate(x, size=(img_size, img_size), mode="bilinear", align_corners=False)
        images = (x.clamp(0, 1) * 255).round().to(torch.uint8).expand(-1, 3, -1, -1).contiguous()  # (N, 3, S, S)
        targets = torch.from_numpy(digits.target).long()
        perm = torch.randperm(len(targets), generator=torch.Generator().manual_seed(split_seed))
        train_idx, val_idx = perm[val_size:], perm[:val_size]

        self.num_classes, self.class_names = 10, [str(i) for i in range(10)]
        self.img_size, self.in_chans = img_size, 3
        train_pixels = images[train_idx].float() / 255
        self.mean = tuple(round(v, 4) for v in train_pixels.mean(dim=(0, 2, 3)).tolist())
        self.std = tuple(round(v, 4) for v in train_pixels.std(dim=(0, 2, 3)).tolist())
        self.train_set = TensorImageDataset(
            images[train_idx],
            targets[train_idx],
            train_transform(img_size, self.mean, self.std, crop_padding, hflip=False),
        )
        self.val_set = TensorImageDataset(
            images[val_idx],
            targets[val_idx],
            v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(self.mean, self.std)]),
        )
        self.memory = {"train": (images[train_idx], targets[train_idx]), "val": (images[val_idx], targets[val_idx])}
        self.crop_padding = crop_padding


def open_cifar(dataset: str, root: str, train: bool, transform=None, download: bool = True) -> datasets.CIFAR10:
    """One split of CIFAR-10/100 from `root`, or a DataError that names the missing or unreadable file."""
    cls = datasets.CIFAR10 if dataset == "cifar10" else datasets.CIFAR100
    try:
        ds = cls(root, train=train, transform=transform, download=download)
    except (KeyError, ValueError, TypeError, AttributeError, EOFError, pickle.UnpicklingError) as e:
        # the files are there (their checksums passed) but not in the layout torchvision reads: name the file
        folder = Path(root, cls.base_folder)
        cifar10 = dataset == "cifar10"
        labels, names = ("labels", "label_names") if cifar10 else ("fine_labels", "fine_label_names")
        batches = [n for n, _ in cls.train_list + cls.test_list]
        problem = cifar_problem(folder, batches, cls.meta["filename"], labels, names)
        raise DataError(problem or f"{folder}: not readable as {dataset} ({type(e).__name__}: {e})") from None
    except (OSError, RuntimeError) as e:  # URLError is an OSError; torchvision raises RuntimeError if absent
        reason = getattr(e, "reason", None) or str(e).splitlines()[0]
        raise DataError(
            f"{dataset} not found in {root}/ and not downloadable ({reason}): put "
            f"{cls.filename} (from {cls.url.rsplit('/', 1)[0]}/) in {root}/ and run again; "
            "`make train` runs the offline digits demo"
        ) from None
    if ds.classes != list(CIFAR10_CLASSES if dataset == "cifar10" else CIFAR100_CLASSES):
        raise DataError(
            f"{root}/{cls.base_folder}/{cls.meta['filename']}: class names {ds.classes[:3]}... differ from {dataset}'s"
        )
    return ds


class CIFARDataModule(ImageClassificationData):
    """CIFAR-10 or CIFAR-100 through torchvision, in `root` (downloaded there when the network allows). The official
    test set serves as validation. Training crops are padded crops (`crop_padding`), or with `crop_scale`
    RandomResizedCrop of that share of the area (what a planned recipe sets)."""

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
    ):
        super().__init__(batch_size, num_workers, in_memory, eval_batch_size)
        crop_scale = check_crop_scale(crop_scale)
        if not 0.0 <= random_erasing <= 1.0:
            raise ValueError(f"random_erasing={random_erasing} must be a probability in [0, 1]")
        if img_size < 1:
            raise ValueError(f"img_size={img_size} must be >= 1")
        if dataset not in ("cifar10", "cifar100"):
            raise ValueError(f"dataset={dataset!r} is not one of ['cifar10', 'cifar100']")
        self.dataset, self.root, self.download = dataset, root, download
        self.class_names = list(CIFAR10_CLASSES if dataset == "cifar10" else CIFAR100_CLASSES)
        # img_size other than 32: the 32 px images are upsampled after augmentation (fine-tuning at 224 px)
        self.num_classes, self.img_size, self.in_chans = len(self.class_names), img_size, 3
        self.mean, self.std = (CIFAR10_MEAN, CIFAR10_STD) if dataset == "cifar10" else (CIFAR100_MEAN, CIFAR100_STD)
        self.train_tf = train_transform(
            32,
            self.mean,
            self.std,
            crop_padding,
            hflip,
            auto_augment,
            autoaugment_policy=v2.AutoAugmentPolicy.CIFAR10,
            random_erasing=random_erasing,
            random_resized_crop=crop_scale is not None,
            crop_scale=crop_scale or (0.35, 1.0),
            rot90=rot90,
        )
        if img_size != 32:
            self.train_tf = v2.Compose([self.train_tf, v2.Resize(img_size, antialias=True)])
        self.eval_tf = eval_transform(img_size, self.mean, self.std)
        self.crop_padding, self.hflip, self.erasing = crop_padding, hflip, random_erasing
        self.rrc_scale = crop_scale  # set: RandomResizedCrop instead of the padded crop (a planned recipe's)
        self.rot90 = rot90
        self.auto_augment = batch_policy(auto_augment, "cifar10")
        # Find (or fetch) the files now, before a Trainer is built: a missing dataset is the run's first line. Under
        # a multi-process launch only local rank 0 fetches; the others wait in prepare_data's barrier.
        if int(os.environ.get("LOCAL_RANK", 0)) == 0:
            self.prepare_data()

    def _open(self, train: bool, transform) -> datasets.CIFAR10:
        return open_cifar(self.dataset, self.root, train, transform, self.download)

    def prepare_data(self) -> None:
        if not getattr(self, "_found", False):  # once: the constructor already looked on local rank 0
            self._open(True, None)
            self._open(False, None)
            self._found = True

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            self.train_set = self._open(True, self.train_tf)
            self.val_set = self._open(False, self.eval_tf)
            # torchvision keeps CIFAR as one uint8 array (N, 32, 32, 3): the in-memory path takes it as it is.
            for split, ds in (("train", self.train_set), ("val", self.val_set)):
                images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()
                self.memory[split] = (images, torch.tensor(ds.targets, dtype=torch.long))


def decode_images(paths: list[str], img_size: int, workers: int | None = None) -> tuple[list, list[tuple[str, str]]]:
    """Decode every image once, in threads (PIL releases the GIL), to the evaluation geometry at img_size (shorter
    side resized, centre crop): a uint8 (3, S, S) tensor per path, or None; and (path, reason) for each failure."""
    from concurrent.futures import ThreadPoolExecutor

    geometry = eval_geometry(img_size)

    def decode(path: str):
        try:
            return geometry(read_image(path)), None
        except Exception as e:  # any failure is a reason to report, never a crash of the run
            return None, describe(e)

    with ThreadPoolExecutor(max_workers=workers or min(8, (os.cpu_count() or 1) + 2)) as pool:
        results = list(pool.map(decode, paths))
    return [img for img, _ in results], [(p, r) for p, (_, r) in zip(paths, results) if r is not None]


def stack_releasing(images: list[torch.Tensor]) -> torch.Tensor:
    """torch.stack of equal-shaped tensors, dropping each from the list once copied: the peak is the stack and one
    image, not two copies of the whole set."""
    out = torch.empty((len(images), *images[0].shape), dtype=images[0].dtype)
    for i in range(len(images)):
        out[i] = images[i]
        images[i] = None
    return out


def channel_mean_std(x: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and (unbiased) std of uint8 images (N, C, H, W) in [0, 1], in float64 chunks: no float copy
    of the whole set (4x the uint8 tensor)."""
    total = torch.zeros(x.shape[1], dtype=torch.float64)
    squares = torch.zeros(x.shape[1], dtype=torch.float64)
    for i in range(0, len(x), chunk):
        part = x[i : i + chunk].double().div_(255)
        total += part.sum(dim=(0, 2, 3))
        squares += part.square().sum(dim=(0, 2, 3))
    n = x.shape[0] * x.shape[2] * x.shape[3]
    mean = total / n
    var = (squares - n * mean.square()) / max(1, n - 1)
    return mean.float(), var.clamp(min=0).sqrt().float().clamp(min=1e-3)  # a constant channel must not divide by 0


def default_memory_budget_gb() -> float:
    """A quarter of the machine's RAM, and at most half of the first GPU's memory when there is one: the in-memory
    path keeps the decoded dataset in RAM and, when training on a GPU, on the GPU."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    budget = 0.25 * ram
    if torch.cuda.is_available():
        budget = min(budget, 0.5 * torch.cuda.get_device_properties(0).total_memory / 2**30)
    return budget


class ImageFolderDataModule(ImageClassificationData):
    """Your own images: `root/train/<class>/*` and `root/val/<class>/*`, or `root/<class>/*` split into train and
    val by `val_fraction` and `split_seed`. Any size and mode (grayscale, RGBA, palette, 16-bit) is converted to RGB.

    Every image is decoded once when the module is built (in threads): corrupt, empty, non-image files and
    decompression bombs are listed with the reason and skipped, or with `strict` the run stops before training; a
    class left with no image is an error either way. When the decoded set fits `max_memory_gb` (default: a quarter of
    the RAM, at most half the GPU's memory), the same decode keeps every image at img_size (shorter side resized,
    centre crop) in one uint8 tensor, and training runs on the in-memory path (vit.device_data: augmentation batched
    on the device; RandomResizedCrop then crops that stored image). Otherwise the folder streams through a DataLoader
    with per-image torchvision transforms. The log says which path was taken and why.

    Args:
        mean, std: normalisation; None: measured on the training images (decoded ones, or 500 of them when streaming).
        in_memory: force the path (True: in memory even over the budget; False: stream); None: by the budget.
        random_erasing: Random Erasing probability per image (after Normalize, value 0).
        rot90: a random quarter turn of each training image (with hflip: the 8 symmetries of the square), for classes
            that keep their label when turned (the planner tests the folder for it).
    """

    def __init__(
        self,
        root: str,
        img_size: int = 32,
        val_fraction: float = 0.2,
        split_seed: int = 0,
        batch_size: int = 64,
        num_workers: int = 2,
        hflip: bool = True,
        auto_augment: AutoAugment = "none",
        random_erasing: float = 0.0,
        crop_scale: tuple[float, float] = (0.35, 1.0),
        mean: tuple[float, float, float] | None = None,
        std: tuple[float, float, float] | None = None,
        check_images: bool = True,
        strict: bool = False,
        in_memory: bool | None = None,
        max_memory_gb: float | None = None,
        eval_batch_size: int | None = None,
        rot90: bool = False,
    ):
        super().__init__(batch_size, num_workers, eval_batch_size=eval_batch_size)
        self.check_images, self.strict = check_images, strict
        if not 0.0 <= random_erasing <= 1.0:
            raise ValueError(f"random_erasing={random_erasing} must be a probability in [0, 1]")
        crop_scale = check_crop_scale(crop_scale)
        if max_memory_gb is not None and max_memory_gb < 0:
            raise ValueError(f"max_memory_gb={max_memory_gb} must be >= 0")
        self.root = Path(root)
        if not self.root.is_dir():
            raise DataError(f"data.root={root!r} is not a folder")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction={val_fraction} must be in (0, 1)")
        split = (self.root / "train").is_dir() and (self.root / "val").is_dir()
        self.train_dir = self.root / "train" if split else self.root
        self.val_dir = self.root / "val" if split else None
        self.class_names = self._classes(self.train_dir)
        if self.val_dir is not None:
            unknown = sorted(set(self._classes(self.val_dir)) - set(self.class_names))
            if unknown:
                raise DataError(f"{self.val_dir}: classes {unknown} are not in {self.train_dir}")
        self.num_classes, self.img_size, self.in_chans = len(self.class_names), img_size, 3
        self.val_fraction, self.split_seed = val_fraction, split_seed
        self._decide_and_decode(in_memory, max_memory_gb)
        if mean is None or std is None:
            measured = self._measure_mean_std()
            mean, std = mean or measured[0], std or measured[1]
        self.mean, self.std = tuple(mean), tuple(std)
        self.train_tf = train_transform(
            img_size,
            self.mean,
            self.std,
            hflip=hflip,
            auto_augment=auto_augment,
            random_resized_crop=True,
            random_erasing=random_erasing,
            crop_scale=crop_scale,
            rot90=rot90,
        )
        self.eval_tf = eval_transform(img_size, self.mean, self.std)
        # the in-memory path's augmentation: the same operations, drawn per image, on the whole batch
        self.rrc_scale, self.hflip, self.rot90, self.erasing = tuple(crop_scale), hflip, rot90, random_erasing
        self.auto_augment = batch_policy(auto_augment, "imagenet")

    def _samples(self, folder: Path) -> list[tuple[str, int]]:
        """(path, class index of train's classes) of every image file under folder/<class>/."""
        to_idx = {c: i for i, c in enumerate(self.class_names)}
        ds = datasets.DatasetFolder(str(folder), loader=load_image, extensions=IMG_EXTENSIONS, allow_empty=True)
        samples = [(p, to_idx[ds.classes[t]]) for p, t in ds.samples]  # val may lack a class that train has
        if not samples:
            raise DataError(f"{folder}: no images with extensions {IMG_EXTENSIONS}")
        return samples

    def _drop_bad(self, folder: Path, samples, bad: list[tuple[str, str]]) -> list[tuple[str, int]]:
        if bad:
            listing = "; ".join(f"{p}: {r}" for p, r in bad[:5]) + (
                f"; and {len(bad) - 5} more" if len(bad) > 5 else ""
            )
            if self.strict:
                raise DataError(f"{folder}: {len(bad)} unreadable image(s) and strict=true: {listing}")
            for p, r in bad:
                log.warning(f"skipping {p}: {r}")
        skip = {p for p, _ in bad}
        samples = [(p, t) for p, t in samples if p not in skip]
        if folder == self.train_dir:
            empty = [c for i, c in enumerate(self.class_names) if i not in {t for _, t in samples}]
            if empty:
                raise DataError(f"{folder}: class folder(s) {empty} hold no usable image")
        return samples

    def _decide_and_decode(self, in_memory: bool | None, max_memory_gb: float | None) -> None:
        """List, check (decoding each image once) and, on the in-memory path, keep every image; split train/val."""
        folders = [self.train_dir] + ([self.val_dir] if self.val_dir is not None else [])
        listed = {f: self._samples(f) for f in folders}
        n = sum(len(v) for v in listed.values())
        need_gb = n * 3 * self.img_size**2 / 2**30
        budget = default_memory_budget_gb() if max_memory_gb is None else max_memory_gb
        self.in_memory = need_gb <= budget if in_memory is None else in_memory
        if self.in_memory:
            why = f"{n} images at {self.img_size} px take {need_gb * 1024:.0f} MB"
            why += f", within max_memory_gb={budget:.1f}" if in_memory is None else " (in_memory=true)"
        else:
            why = f"{n} images at {self.img_size} px would take {need_gb:.2f} GB"
            why += f", over max_memory_gb={budget:.2f}" if in_memory is None else " (in_memory=false)"
        t = time.perf_counter()
        kept: dict[Path, tuple[list, list]] = {}
        for folder, samples in listed.items():
            if self.in_memory or self.check_images:
                images, bad = decode_images([p for p, _ in samples], self.img_size)
                good = self._drop_bad(folder, samples, bad)
                images = [img for img in images if img is not None]
            else:
                good, images = self._drop_bad(folder, samples, []), []
            kept[folder] = (good, images if self.in_memory else [])
        path = "in-memory path (batched augmentation on the training device)" if self.in_memory else "streaming path"
        rank_zero_info(f"{self.root}: {path}: {why}; decoded in {time.perf_counter() - t:.1f} s")
        train, train_images = kept[self.train_dir]
        if self.val_dir is not None:
            val, val_images = kept[self.val_dir]
        else:  # one seeded permutation splits the checked list (and the decoded images with it)
            perm = torch.randperm(len(train), generator=torch.Generator().manual_seed(self.split_seed)).tolist()
            n_val = max(1, round(len(perm) * self.val_fraction))
            if n_val >= len(perm):
                raise DataError(
                    f"{self.root}: {len(perm)} images are too few to split with val_fraction={self.val_fraction}"
                )
            pick = lambda items, idx: [items[i] for i in idx] if items else []  # noqa: E731
            val, val_images = pick(train, perm[:n_val]), pick(train_images, perm[:n_val])
            train, train_images = pick(train, perm[n_val:]), pick(train_images, perm[n_val:])
        self.samples = {"train": train, "val": val}
        if self.in_memory:
            for split, items, images in (("train", train, train_images), ("val", val, val_images)):
                targets = torch.tensor([t for _, t in items], dtype=torch.long)
                self.memory[split] = (stack_releasing(images), targets)  # (N, 3, S, S) uint8

    def _measure_mean_std(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-channel mean and std of the training images in [0, 1]: all decoded ones, or 500 when streaming."""
        if self.in_memory:
            x = self.memory["train"][0]
        else:
            paths = [p for p, _ in self.samples["train"]]
            pick = torch.randperm(len(paths), generator=torch.Generator().manual_seed(0))[:500].tolist()
            x = torch.stack(
                [img for img in decode_images([paths[i] for i in pick], self.img_size)[0] if img is not None]
            )
        mean, std = channel_mean_std(x)
        return tuple(round(v, 4) for v in mean.tolist()), tuple(round(v, 4) for v in std.tolist())

    @staticmethod
    def _classes(folder: Path) -> list[str]:
        try:
            classes, _ = find_classes(str(folder))
        except FileNotFoundError:
            raise DataError(f"{folder}: no class subfolders (expected {folder}/<class>/<image>)") from None
        return classes

    def _dataset(self, split: str, transform) -> datasets.DatasetFolder:
        """The streaming path's dataset of a split: the checked file list, decoded again per item."""
        ds = datasets.DatasetFolder(
            str(self.train_dir), loader=load_image, extensions=IMG_EXTENSIONS, transform=transform, allow_empty=True
        )
        ds.samples = list(self.samples[split])
        ds.targets = [t for _, t in ds.samples]
        return ds

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        if self.in_memory:  # per-item views of the decoded tensors (the loaders use the tensors directly)
            to_float = v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(self.mean, self.std)])
            self.train_set = TensorImageDataset(*self.memory["train"], self.train_tf)
            self.val_set = TensorImageDataset(*self.memory["val"], to_float)
        else:
            self.train_set = self._dataset("train", self.train_tf)
            self.val_set = self._dataset("val", self.eval_tf)
