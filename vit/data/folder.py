"""Your own images: a folder of class folders (root/<class>/*, or split folders root/train, val, test), or any folder
with a labels file (path, label[, split][, group]); decoded once in threads and held in memory when it fits."""

import logging
import os
import time
from pathlib import Path

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import Dataset

from vit.data.base import ImageClassificationData, TensorImageDataset, channel_mean_std, given_mean_std, rounded
from vit.data.images import describe, image_at, load_image, read_image, same_dtype
from vit.data.listing import list_data
from vit.data.transforms import (
    Augmentation,
    AutoAugment,
    DataError,
    check_crop_scale,
    eval_transform,
    to_normalized,
    train_transform,
)
from vit.data.val_split import split_validation

log = logging.getLogger(__name__)


def decode_images(
    paths: list[str], img_size: int, workers: int | None = None, in_chans: int | None = None
) -> tuple[list, list[tuple[str, str]]]:
    """Decode every image once, in threads (PIL releases the GIL), to the evaluation geometry at img_size (shorter
    side resized, centre crop): a (C, S, S) tensor per path (uint8; float32 in [0, 1] for 16-bit and multi-band
    files; C: in_chans, or None: 3 for 8-bit and grey, a TIFF's bands), or None; and (path, reason) per failure."""
    from concurrent.futures import ThreadPoolExecutor

    def decode(path: str):
        try:
            return image_at(read_image(path, in_chans), img_size), None
        except Exception as e:  # any failure is a reason to report, never a crash of the run
            return None, describe(e)

    with ThreadPoolExecutor(max_workers=workers or min(8, (os.cpu_count() or 1) + 2)) as pool:
        results = list(pool.map(decode, paths))
    return [img for img, _ in results], [(p, r) for p, (_, r) in zip(paths, results) if r is not None]


def check_numbers(random_erasing: float, max_memory_gb: float | None, val_fraction: float) -> None:
    """A ValueError naming the first argument out of its range."""
    if not 0.0 <= random_erasing <= 1.0:
        raise ValueError(f"random_erasing={random_erasing} must be a probability in [0, 1]")
    if max_memory_gb is not None and max_memory_gb < 0:
        raise ValueError(f"max_memory_gb={max_memory_gb} must be >= 0")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction={val_fraction} must be in (0, 1)")


def one_channel(img: torch.Tensor) -> bool:
    """A decoded (3, H, W) image whose three channels are equal: a grey image, however its file stored it."""
    return len(img) == 3 and bool(torch.equal(img[0], img[1]) and torch.equal(img[1], img[2]))


def channels_of(root: Path, seen: dict[str, list[tuple[str, int, bool]]]) -> int:
    """The model's input channels from what was decoded ({split: [(path, channels, grey)]}): 1 when every training
    image is grey (three equal channels, whatever its file's mode), else the images' one channel count (3, or a
    TIFF's bands); images that disagree are a DataError naming one of each."""
    counts = {c: path for items in seen.values() for path, c, _ in reversed(items)}  # the first path of each count
    if len(counts) > 1:
        named = ", ".join(f"{p} has {c}" for c, p in sorted(counts.items()))
        raise DataError(f"{root}: images with different channel counts: {named}; give every image the same bands")
    return 1 if all(grey for _, _, grey in seen["train"]) else next(iter(counts), 3)


def stack_releasing(images: list[torch.Tensor]) -> torch.Tensor:
    """torch.stack of equal-shaped tensors, dropping each from the list once copied: the peak is the stack and one
    image, not two copies of the whole set."""
    out = torch.empty((len(images), *images[0].shape), dtype=images[0].dtype)
    for i in range(len(images)):
        out[i] = images[i]
        images[i] = None
    return out


def default_memory_budget_gb() -> float:
    """A quarter of the machine's RAM, and at most half of the first GPU's memory when there is one: the in-memory
    path keeps the decoded dataset in RAM and, when training on a GPU, on the GPU."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    budget = 0.25 * ram
    if torch.cuda.is_available():
        budget = min(budget, 0.5 * torch.cuda.get_device_properties(0).total_memory / 2**30)
    return budget


class FileImageDataset(Dataset):
    """(path, target) pairs, each file decoded per item: the streaming path of a folder or a labels file."""

    def __init__(self, samples: list[tuple[str, int]], transform, soft: torch.Tensor | None = None, in_chans: int = 3):
        # soft: (N, C) targets that replace the class index (probabilities, or a multi-label 0/1 vector), or None
        self.samples, self.transform, self.soft, self.in_chans = samples, transform, soft, in_chans
        self.targets = [t for _, t in samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, target = self.samples[i]
        return self.transform(load_image(path, self.in_chans)), (target if self.soft is None else self.soft[i])


class ImageFolderDataModule(ImageClassificationData):
    """Your own images, in any layout vit/data/listing.py reads: `root/<class>/*`; split folders `root/train/<class>/*`
    with `val/` and/or `test/` beside it (timm's and Hugging Face's names); or any files under root named in a labels
    file (`labels`: CSV or TSV with a path and a label column, optional `split` and `group` columns). Any size and
    mode (grayscale, RGBA, palette, 16-bit) is read as RGB, or as grey where every training image is grey.

    Validation: given (a val folder, or `split` = val rows), or split off the training images, seeded by
    `split_seed`: `val_fraction` of each class (stratified), and with groups (the labels file's group column, or
    `group_by`, a regular expression over the relative path) no group on both sides. A test split (a test folder, or
    `split` = test rows) is never used to choose anything: `vit-train fit` scores the chosen checkpoint on it once at
    the end, and `vit-train test` scores it.

    Every image is decoded once when the module is built (in threads): corrupt, empty, non-image files and
    decompression bombs (and a labels file's bad rows: no path, missing file, empty label, duplicate) are listed with
    the reason and skipped, or with `strict` the run stops before training; a class left with no image is an error
    either way. When the decoded set fits `max_memory_gb` (default: a quarter of the RAM, at most half the GPU's
    memory), the same decode keeps every image at img_size (shorter side resized, centre crop) in one uint8 tensor,
    and training runs on the in-memory path (vit.data.device: augmentation batched on the device; RandomResizedCrop
    then crops that stored image). Otherwise the files stream through a DataLoader with per-image torchvision
    transforms. The log says which layout was found and which path was taken, and why.

    Args:
        labels: a labels file (CSV; .tsv/.tab: tab-separated); paths in it are relative to root (or absolute).
        path_column, label_column: its columns; None: the first of Hugging Face's, fastai's and the usual names
            (file_name, path, filename, fname, image, ...; label, labels, class, target, category).
        split_column, group_column: its optional split (train / val / test, and their synonyms) and group columns.
        group_by: a regular expression searched in each path relative to root: its first group (or the whole match)
            is the image's group (e.g. `"patient_(\\d+)"`), kept on one side of the validation split.
        in_chans: 1 or 3 channels; None: 1 when every training image is grey (three equal channels once decoded,
            whatever its file's mode), else 3. A grey folder trains a 1-channel model, and predict reads files as grey.
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
        mean: tuple[float, ...] | None = None,
        std: tuple[float, ...] | None = None,
        check_images: bool = True,
        strict: bool = False,
        in_memory: bool | None = None,
        max_memory_gb: float | None = None,
        eval_batch_size: int | None = None,
        rot90: bool = False,
        labels: str | None = None,
        path_column: str | None = None,
        label_column: str | None = None,
        split_column: str = "split",
        group_column: str = "group",
        group_by: str | None = None,
        soft_labels: bool | None = None,
        label_delimiter: str | None = None,
        in_chans: int | None = None,
    ):
        super().__init__(batch_size, num_workers, eval_batch_size=eval_batch_size)
        crop_scale = check_crop_scale(crop_scale)
        check_numbers(random_erasing=random_erasing, max_memory_gb=max_memory_gb, val_fraction=val_fraction)
        self.check_images, self.strict, self.root = check_images, strict, Path(root)
        self.listing = list_data(
            self.root,
            labels=labels,
            path_column=path_column,
            label_column=label_column,
            split_column=split_column,
            group_column=group_column,
            group_by=group_by,
            strict=strict,
            label_delimiter=label_delimiter,
        )
        self.class_names = self.listing.class_names
        # soft targets: train on the labels file's probabilities (None: whenever it has them); false: on the
        # thresholded labels. Validation and test are scored against the thresholded labels either way.
        self.soft_labels = bool(self.listing.soft) and soft_labels is not False
        # several labels an image: every target is a (C,) 0/1 vector, trained with a sigmoid per label
        self.task = "multilabel" if self.listing.multi else "multiclass"
        if in_chans is not None and in_chans < 1:
            raise ValueError(f"in_chans={in_chans} must be >= 1 (None: from the images)")
        self.num_classes, self.img_size, self.in_chans = len(self.class_names), img_size, in_chans
        self.val_fraction, self.split_seed = val_fraction, split_seed
        self._decide_and_decode(in_memory, max_memory_gb)
        if mean is None or std is None:
            measured = self._measure_mean_std()
            mean, std = mean or measured[0], std or measured[1]
        self.mean, self.std = given_mean_std(mean, std, self.in_chans, own=None)  # one value or three
        self._set_augmentation(hflip, auto_augment, random_erasing, crop_scale, rot90)

    def _set_augmentation(self, hflip: bool, auto_augment: str, random_erasing: float, crop_scale, rot90: bool) -> None:
        """The streaming path's per-image transforms and the in-memory path's batched ones: the same operations."""
        if self.wide and auto_augment != "none":  # its colour operations are tables over the 256 values of 8 bits
            log.warning(f"auto_augment={auto_augment} is off: {self.root} holds pixels of more than 8 bits or 3 bands")
            auto_augment = "none"
        self.augmentation = Augmentation(
            hflip=hflip, rot90=rot90, rrc_scale=crop_scale, auto_augment=auto_augment, erasing=random_erasing
        )
        self.train_tf = train_transform(self.img_size, self.mean, self.std, self.augmentation)
        self.eval_tf = eval_transform(self.img_size, self.mean, self.std)

    def _drop_bad(self, split: str, samples, bad: list[tuple[str, str]]) -> list[tuple[str, int]]:
        if bad:
            listing = "; ".join(f"{p}: {r}" for p, r in bad[:5]) + (
                f"; and {len(bad) - 5} more" if len(bad) > 5 else ""
            )
            if self.strict:
                raise DataError(f"{self.root} ({split}): {len(bad)} unreadable image(s) and strict=true: {listing}")
            for p, r in bad:
                log.warning(f"skipping {p}: {r}")
        skip = {p for p, _ in bad}
        samples = [(p, t) for p, t in samples if p not in skip]
        if split == "train":
            # every label of a multi-label image counts (its class index is only its rarest label)
            multi = self.listing.multi or {}
            present = {i for p, t in samples for i in (multi[p] if p in multi else (t,))}
            empty = [c for i, c in enumerate(self.class_names) if i not in present]
            if empty:
                raise DataError(f"{self.root}: class(es) {empty} hold no usable training image")
        return samples

    def _decide_and_decode(self, in_memory: bool | None, max_memory_gb: float | None) -> None:
        """Check (decoding each image once) and, on the in-memory path, keep every image of every split listed;
        split validation off the training images when the layout gives none."""
        listed = self.listing.splits
        n = sum(len(v) for v in listed.values())
        need_gb = self.need_gb = n * self.bytes_per_pixel() * self.img_size**2 / 2**30
        budget = default_memory_budget_gb() if max_memory_gb is None else max_memory_gb
        self.in_memory = need_gb <= budget if in_memory is None else in_memory
        if self.in_memory:
            why = f"{n} images at {self.img_size} px take {need_gb * 1024:.0f} MB"
            why += f", within max_memory_gb={budget:.1f}" if in_memory is None else " (in_memory=true)"
        else:
            why = f"{n} images at {self.img_size} px would take {need_gb:.2f} GB"
            why += f", over max_memory_gb={budget:.2f}" if in_memory is None else " (in_memory=false)"
        t = time.perf_counter()
        kept: dict[str, tuple[list, list]] = {}
        seen: dict[str, list[tuple[str, int, bool]]] = {}  # split -> (path, channels, grey) of each decoded image
        for split, samples in listed.items():
            if self.in_memory or self.check_images:
                images, bad = decode_images([p for p, _ in samples], self.img_size, in_chans=self.in_chans)
                good = self._drop_bad(split, samples, bad)
                images = [img for img in images if img is not None]
                seen[split] = [(p, len(img), one_channel(img)) for (p, _), img in zip(good, images)]
                kept[split] = (good, images if self.in_memory else [])
            else:
                kept[split] = (self._drop_bad(split, samples, []), [])
        if self.in_chans is None:  # grey data trains a 1-channel model, a 5-band one a 5-channel model
            self.in_chans = channels_of(self.root, seen) if seen.get("train") else 3
        # one dtype for the store: uint8, or float32 in [0, 1] once any image has more than 8 bits or 3 bands
        all_images = same_dtype([img[:1] if self.in_chans == 1 else img for _, imgs in kept.values() for img in imgs])
        self.wide = bool(all_images) and all_images[0].is_floating_point()
        for split, (good, images) in kept.items():  # (1, S, S) views for grey: the stack copies them once
            kept[split] = (good, all_images[: len(images)])
            del all_images[: len(images)]
        path = "in-memory path (batched augmentation on the training device)" if self.in_memory else "streaming path"
        if self.wide:
            path += ", pixels kept as float32 (more than 8 bits or more than 3 bands: 4x the memory of 8-bit)"
        rank_zero_info(f"{self.root}: {self.listing.found}; {path}: {why}; decoded in {time.perf_counter() - t:.1f} s")
        if "val" not in kept:  # split off the checked training list (and the decoded images with it)
            train, val = split_validation(
                kept["train"][0], self.val_fraction, self.split_seed, self.listing.groups, self.listing.multi
            )
            index = {p: i for i, (p, _) in enumerate(kept["train"][0])}
            images = kept["train"][1]
            pick = lambda items: [images[index[p]] for p, _ in items] if images else []  # noqa: E731
            kept["val"], kept["train"] = (val, pick(val)), (train, pick(train))
        self.samples = {split: items for split, (items, _) in kept.items()}
        if self.in_memory:
            for split, (items, images) in kept.items():
                self.memory[split] = (stack_releasing(images), self.targets_of(items))  # (N, 3, S, S) uint8
        if self.soft_labels:  # (N, C) class probabilities of the training images, the training loss's targets
            self.soft_targets = {
                split: torch.tensor([self.listing.soft[p] for p, _ in items], dtype=torch.float32)
                for split, items in self.samples.items()
            }

    def bytes_per_pixel(self) -> int:
        """What a stored pixel takes, from the first training image that decodes: its channels (3 for 8-bit files,
        grey ones included, as they decode), four bytes each for float pixels (16-bit, multi-band); 3 if none does."""
        for path, _ in self.listing.splits["train"][:20]:
            try:
                img = read_image(path, self.in_chans)
            except Exception:  # reported with the reason when the folder is decoded
                continue
            if not isinstance(img, torch.Tensor):
                return len(img.getbands())
            return len(img) * (4 if img.is_floating_point() else 1)
        return 3

    def targets_of(self, items: list[tuple[str, int]]) -> torch.Tensor:
        """The targets of (path, class) items: (N,) class indices, or for multi-label (N, C) 0/1 floats."""
        if self.task != "multilabel":
            return torch.tensor([t for _, t in items], dtype=torch.long)
        targets = torch.zeros(len(items), self.num_classes)
        for i, (path, _) in enumerate(items):
            targets[i, list(self.listing.multi[path])] = 1.0
        return targets

    def _measure_mean_std(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-channel mean and std of the training images in [0, 1]: all decoded ones, or 500 when streaming."""
        if self.in_memory:
            x = self.memory["train"][0]
        else:
            paths = [p for p, _ in self.samples["train"]]
            pick = torch.randperm(len(paths), generator=torch.Generator().manual_seed(0))[:500].tolist()
            decoded = decode_images([paths[i] for i in pick], self.img_size, in_chans=self.in_chans)[0]
            x = torch.stack(same_dtype([img for img in decoded if img is not None]))
        mean, std = channel_mean_std(x)
        return rounded(mean.tolist()), rounded(std.tolist())

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        if self.in_memory:  # per-item views of the decoded tensors (the loaders use the tensors directly)
            to_float = to_normalized(self.mean, self.std)
            self.train_set = TensorImageDataset(*self.memory["train"], self.train_tf)
            self.val_set = TensorImageDataset(*self.memory["val"], to_float)
        else:
            multi = self.task == "multilabel"
            train_targets = self.targets_of(self.samples["train"]) if multi else self.soft_targets.get("train")
            self.train_set = FileImageDataset(self.samples["train"], self.train_tf, train_targets, self.in_chans)
            val_targets = self.targets_of(self.samples["val"]) if multi else None
            self.val_set = FileImageDataset(self.samples["val"], self.eval_tf, val_targets, self.in_chans)
        if "test" in self.samples:
            self.test_set = (
                TensorImageDataset(*self.memory["test"], to_normalized(self.mean, self.std))
                if self.in_memory
                else FileImageDataset(
                    self.samples["test"],
                    self.eval_tf,
                    self.targets_of(self.samples["test"]) if self.task == "multilabel" else None,
                    self.in_chans,
                )
            )

    @property
    def has_test_split(self) -> bool:
        return "test" in self.samples

    def test_dataloader(self):
        """The test split when the layout gives one (scored, never used to choose), else the validation split."""
        if not self.has_test_split:
            return self.val_dataloader()
        if self.in_memory:
            return self._device_batches("test")
        self.setup("test")
        return self._loader(self.test_set, train=False)
