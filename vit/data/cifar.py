"""CIFAR-10/100 from torchvision's files (checked before use: a missing or broken file is named)."""

import logging
import os
import pickle
from pathlib import Path
from typing import Literal

import torch
from torchvision import datasets
from torchvision.transforms import v2

from vit.data.base import ImageClassificationData, given_mean_std
from vit.data.files import cifar_problem
from vit.data.transforms import (
    AutoAugment,
    DataError,
    batch_policy,
    check_crop_scale,
    eval_transform,
    train_transform,
)

log = logging.getLogger(__name__)

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
    RandomResizedCrop of that share of the area (what a planned recipe sets). `mean`, `std`: the normalisation (None:
    CIFAR's published one; pretrained weights' own, set by `--model.init_from`)."""

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
        published = (CIFAR10_MEAN, CIFAR10_STD) if dataset == "cifar10" else (CIFAR100_MEAN, CIFAR100_STD)
        self.mean, self.std = given_mean_std(mean, std, 3, published)
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
