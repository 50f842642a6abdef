"""DataModules: CIFAR-10/100 (torchvision), a folder of your own images, and the built-in offline `digits` set.

Each DataModule knows, from its constructor alone, what the model needs to be built and what predict needs to
preprocess an image the way training did: `num_classes`, `class_names`, `img_size`, `in_chans`, `mean`, `std`.
`train.py` links these into the LightningModule, which stores them in every checkpoint as plain types.
"""

import copy
import logging
import warnings
from functools import partial
from pathlib import Path
from typing import Literal

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Subset
from torchvision import datasets
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes
from torchvision.transforms import v2

from vit.device_data import DeviceBatches

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


def load_image(path: str | Path) -> Image.Image:
    """Open any image as 8-bit RGB: grayscale, palette, RGBA (composited on white), CMYK and 16-bit included."""
    img = Image.open(path)
    img.load()
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        # 16/32-bit integer grayscale: PIL's convert('L') clips instead of scaling, so scale by the type's range.
        arr = np.asarray(img, dtype=np.float64)
        top = 65535.0 if img.mode.startswith("I;16") or arr.max() > 255 else 255.0
        img = Image.fromarray(np.clip(arr / top * 255.0 + 0.5, 0, 255).astype(np.uint8))
    if img.mode == "P" or img.mode in ("RGBA", "LA", "PA"):
        img = img.convert("RGBA")
        background = Image.new("RGBA", img.size, (255, 255, 255, 255))
        img = Image.alpha_composite(background, img)
    return img.convert("RGB")


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


def read_image(path: str | Path) -> Image.Image:
    """load_image, with PIL's decompression-bomb warning (huge declared size) raised as an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        return load_image(path)


def describe(e: BaseException) -> str:
    """A short reason for a failed image."""
    if isinstance(e, FileNotFoundError):
        return "no such file"
    if isinstance(e, IsADirectoryError):
        return "is a folder"
    if isinstance(e, PermissionError):
        return "permission denied"
    if isinstance(e, (Image.DecompressionBombError, Image.DecompressionBombWarning)):
        return f"refused: declared size too large (decompression bomb?): {e}".split(". ")[0]
    if isinstance(e, Image.UnidentifiedImageError):
        return "not an image (or an empty file)"
    return " ".join(str(e).split()) or type(e).__name__


def check_images(paths: list[str], workers: int = 4) -> list[tuple[str, str]]:
    """Decode every image once (threads: PIL releases the GIL); return (path, reason) for each one that fails."""
    from concurrent.futures import ThreadPoolExecutor

    def check(path: str) -> str | None:
        try:
            read_image(path)
        except Exception as e:  # any failure is a reason to report, never a crash of the run
            return describe(e)
        return None

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return [(p, r) for p, r in zip(paths, pool.map(check, paths)) if r is not None]


def train_transform(
    img_size: int,
    mean,
    std,
    crop_padding: int = 4,
    hflip: bool = True,
    auto_augment: AutoAugment = "none",
    random_resized_crop: bool = False,
    autoaugment_policy: v2.AutoAugmentPolicy = v2.AutoAugmentPolicy.IMAGENET,
) -> v2.Compose:
    """Training augmentation for a PIL image or a uint8 (C, H, W) tensor -> normalised float tensor."""
    if random_resized_crop:
        ops = [v2.RandomResizedCrop(img_size, scale=(0.35, 1.0), antialias=True)]
    else:
        ops = [v2.RandomCrop(img_size, padding=crop_padding)] if crop_padding else []
    if hflip:
        ops.append(v2.RandomHorizontalFlip())
    if auto_augment != "none":
        ops.append(augment_policy(auto_augment, autoaugment_policy))
    return v2.Compose([*ops, v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])


def eval_geometry(img_size: int) -> v2.Compose:
    """Shorter side to img_size, centre crop: PIL image -> uint8 (C, img_size, img_size) tensor."""
    return v2.Compose([v2.ToImage(), v2.Resize(img_size, antialias=True), v2.CenterCrop(img_size)])


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
        self.crop_padding, self.hflip, self.per_image = 0, False, None

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
            per_image=self.per_image,
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
        )

    def train_dataloader(self) -> DataLoader | DeviceBatches:
        return self._device_batches("train") if self.in_memory else self._loader(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader | DeviceBatches:
        return self._device_batches("val") if self.in_memory else self._loader(self.val_set, train=False)

    def test_dataloader(self) -> DataLoader | DeviceBatches:
        return self.val_dataloader()


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


class CIFARDataModule(ImageClassificationData):
    """CIFAR-10 or CIFAR-100 through torchvision, in `root` (downloaded there when the network allows). The official
    test set serves as validation."""

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
        in_memory: bool = True,
        img_size: int = 32,
        eval_batch_size: int | None = None,
    ):
        super().__init__(batch_size, num_workers, in_memory, eval_batch_size)
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
            32, self.mean, self.std, crop_padding, hflip, auto_augment, autoaugment_policy=v2.AutoAugmentPolicy.CIFAR10
        )
        if img_size != 32:
            self.train_tf = v2.Compose([self.train_tf, v2.Resize(img_size, antialias=True)])
        self.eval_tf = eval_transform(img_size, self.mean, self.std)
        self.crop_padding, self.hflip = crop_padding, hflip
        self.per_image = augment_policy(auto_augment, v2.AutoAugmentPolicy.CIFAR10)

    def _open(self, train: bool, transform) -> datasets.CIFAR10:
        cls = datasets.CIFAR10 if self.dataset == "cifar10" else datasets.CIFAR100
        try:
            ds = cls(self.root, train=train, transform=transform, download=self.download)
        except (OSError, RuntimeError) as e:  # URLError is an OSError; torchvision raises RuntimeError if absent
            reason = getattr(e, "reason", None) or str(e).splitlines()[0]
            raise DataError(
                f"{self.dataset} not found in {self.root}/ and not downloadable ({reason}): put "
                f"{cls.filename} (from {cls.url.rsplit('/', 1)[0]}/) in {self.root}/ and run again; "
                "`make train` runs the offline digits demo"
            ) from None
        if ds.classes != self.class_names:
            raise DataError(
                f"{self.root}/{cls.base_folder}/{cls.meta['filename']}: class names {ds.classes[:3]}... "
                f"differ from {self.dataset}'s"
            )
        return ds

    def prepare_data(self) -> None:
        self._open(True, None)
        self._open(False, None)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            self.train_set = self._open(True, self.train_tf)
            self.val_set = self._open(False, self.eval_tf)
            # torchvision keeps CIFAR as one uint8 array (N, 32, 32, 3): the in-memory path takes it as it is.
            for split, ds in (("train", self.train_set), ("val", self.val_set)):
                images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()
                self.memory[split] = (images, torch.tensor(ds.targets, dtype=torch.long))


class ImageFolderDataModule(ImageClassificationData):
    """Your own images: `root/train/<class>/*` and `root/val/<class>/*`, or `root/<class>/*` split into train and
    val by `val_fraction` and `split_seed`. Any size and mode (grayscale, RGBA, palette, 16-bit) is converted to RGB.

    At setup every image is decoded once (`check_images`): corrupt, empty, non-image files and decompression bombs
    are listed with the reason and skipped, or with `strict` the run stops before training. A class left with no
    image is an error either way."""

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
        mean: tuple[float, float, float] = IMAGENET_MEAN,
        std: tuple[float, float, float] = IMAGENET_STD,
        check_images: bool = True,
        strict: bool = False,
        eval_batch_size: int | None = None,
    ):
        super().__init__(batch_size, num_workers, eval_batch_size=eval_batch_size)
        self.check_images, self.strict = check_images, strict
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
        self.mean, self.std = tuple(mean), tuple(std)
        self.val_fraction, self.split_seed = val_fraction, split_seed
        self.train_tf = train_transform(
            img_size, mean, std, hflip=hflip, auto_augment=auto_augment, random_resized_crop=True
        )
        self.eval_tf = eval_transform(img_size, mean, std)

    @staticmethod
    def _classes(folder: Path) -> list[str]:
        try:
            classes, _ = find_classes(str(folder))
        except FileNotFoundError:
            raise DataError(f"{folder}: no class subfolders (expected {folder}/<class>/<image>)") from None
        return classes

    def _folder(self, folder: Path, transform) -> datasets.ImageFolder:
        to_idx = {c: i for i, c in enumerate(self.class_names)}
        ds = datasets.DatasetFolder(
            str(folder), loader=load_image, extensions=IMG_EXTENSIONS, transform=transform, allow_empty=True
        )
        # Map val's classes onto train's indices (val may lack a class that train has).
        ds.samples = [(p, to_idx[ds.classes[t]]) for p, t in ds.samples]
        if not ds.samples:
            raise DataError(f"{folder}: no images with extensions {IMG_EXTENSIONS}")
        if self.check_images:
            bad = check_images([p for p, _ in ds.samples])
            if bad:
                listing = "; ".join(f"{p}: {r}" for p, r in bad[:5]) + (
                    f"; and {len(bad) - 5} more" if len(bad) > 5 else ""
                )
                if self.strict:
                    raise DataError(f"{folder}: {len(bad)} unreadable image(s) and strict=true: {listing}")
                for p, r in bad:
                    log.warning(f"skipping {p}: {r}")
                skip = {p for p, _ in bad}
                ds.samples = [(p, t) for p, t in ds.samples if p not in skip]
        ds.targets = [t for _, t in ds.samples]
        if folder == self.train_dir:
            empty = [c for i, c in enumerate(self.class_names) if i not in set(ds.targets)]
            if empty:
                raise DataError(f"{folder}: class folder(s) {empty} hold no usable image")
        return ds

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        if self.val_dir is not None:
            self.train_set = self._folder(self.train_dir, self.train_tf)
            self.val_set = self._folder(self.val_dir, self.eval_tf)
            return
        # Two dataset objects (train and eval transforms) over one permutation: a random_split of one dataset would
        # give validation the training augmentation.
        train_ds = self._folder(self.train_dir, self.train_tf)
        val_ds = copy.copy(train_ds)  # the same checked file list, with the evaluation transform
        val_ds.transform = self.eval_tf
        perm = torch.randperm(len(train_ds), generator=torch.Generator().manual_seed(self.split_seed)).tolist()
        n_val = max(1, round(len(perm) * self.val_fraction))
        if n_val >= len(perm):
            raise DataError(
                f"{self.root}: {len(perm)} images are too few to split with val_fraction={self.val_fraction}"
            )
        self.train_set, self.val_set = Subset(train_ds, perm[n_val:]), Subset(val_ds, perm[:n_val])
