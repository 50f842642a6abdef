"""Every data source as the recipe planner reads it, before any DataModule is built: the training split's counts, its
labels, its image headers and its images. One fingerprint (vit/planning/fingerprint.py) and one rule table then plan
folders, CIFAR, torchvision datasets and litdata streams alike.

    src = source_for(config.data)      # a parsed `data:` config (class_path, init_args)
    src = folder_source("photos/")     # or one source directly
    fp = fingerprint(src)              # vit/planning/fingerprint.py: counts, sizes, channels, symmetries, decode time

Nothing is decoded here beyond what a header read needs; the fingerprint decodes its small sample through `image`.
"""

from __future__ import annotations

import importlib
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from vit.data.cifar_files import open_cifar
from vit.data.images import convert_image, read_image, tiff_size
from vit.data.listing import list_data
from vit.data.transforms import DataError

GRAY_MODES = {"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F"}
# Items a stream's class counts are estimated from when its vit_meta.json has none (chunks written before the
# optimize command recorded them): each read may fetch a chunk.
STREAM_LABEL_SAMPLE = 2000


@dataclass
class DataSource:
    """The training split of one data source, as the fingerprint reads it.

    Args:
        name: how the plan names the data (a folder, `torch/mnist in data/`, a chunk folder).
        n_train, n_val: images the run will train and validate on.
        class_counts: training images per class (of a stream without recorded counts: estimated from a sample).
        n_items: how many items `label`, `header` and `image` index (a folder's listing, the training split).
        label, header, image: item i's class; its (width, height, grayscale) from the cheapest read (a file header);
            the image itself, decoded, as RGB (convert_image), or None when unreadable.
        decodes: the DataModule decodes every image once at start, which the budget counts; False where the split
            is held as arrays already (CIFAR, MNIST) or decoded inside each epoch (a stream).
        in_chans: channels the model will train on (1 for grayscale torchvision sets, 3 otherwise).
    """

    name: str
    n_train: int
    n_val: int
    class_counts: list[int]
    n_items: int
    label: Callable[[int], int]
    header: Callable[[int], tuple[int, int, bool] | None]
    image: Callable[[int], Image.Image | None]
    decodes: bool
    in_chans: int = 3
    task: str = "multiclass"  # "multilabel": several labels an image (class_counts: images carrying each label)
    grey_to_one: bool = False  # in_chans 1 when the images are grey (a folder's rule: vit.data.folder.one_channel)
    soft_labels: bool = False  # the labels file gives each image's class probabilities


def is_gray(im: Image.Image) -> bool:
    """Grayscale modes, and palettes whose colours are all greys."""
    if im.mode == "P" and (pal := im.getpalette()) is not None:
        rgb = pal[: 3 * 256]
        return all(rgb[i] == rgb[i + 1] == rgb[i + 2] for i in range(0, len(rgb), 3))
    return im.mode in GRAY_MODES


def _file_header(path) -> tuple[int, int, bool] | None:
    try:
        with Image.open(path) as im:
            w, h = im.size
            turned = im.getexif().get(0x0112, 1) in (5, 6, 7, 8)  # EXIF orientations that swap width and height
            return (h, w, is_gray(im)) if turned else (w, h, is_gray(im))
    except Exception:  # unreadable files are the data module's to report, with the reason
        try:
            size = tiff_size(path)  # a planar multi-band TIFF (PIL opens none): bands, not grey
            return None if size is None else (*size, False)
        except Exception:
            return None


def _file_image(path) -> Image.Image | torch.Tensor | None:
    try:
        return read_image(path, in_chans=None)  # a multi-band TIFF with all its bands
    except Exception:
        return None


# ---------------------------------------------------------------------------------------------------------------------
# Folders
# ---------------------------------------------------------------------------------------------------------------------


def folder_source(root: str | Path, val_fraction: float = 0.2, **listing) -> DataSource:
    """A user's data as ImageFolderDataModule reads it (vit/data/listing.py: class folders, split folders, or a
    labels file named in `listing`'s keywords): counts from the training listing (less val_fraction when validation is
    split off it; a test split is not trained on), sizes and modes from file headers."""
    listed = list_data(root, **listing)
    train = listed.splits["train"]
    counts = [0] * len(listed.class_names)
    for path, t in train:
        for c in listed.multi.get(path, (t,)):  # multi-label: every label an image carries
            counts[c] += 1
    if "val" in listed.splits:
        n_val, n_train = len(listed.splits["val"]), len(train)
    else:
        n_val = max(1, round(len(train) * val_fraction))
        n_train = len(train) - n_val
        counts = [max(1, round(c * (1 - val_fraction))) for c in counts]
    return DataSource(
        name=str(root),
        n_train=n_train,
        n_val=n_val,
        class_counts=counts,
        n_items=len(train),
        label=lambda i: train[i][1],
        header=lambda i: _file_header(train[i][0]),
        image=lambda i: _file_image(train[i][0]),
        decodes=True,
        task="multilabel" if listed.multi else "multiclass",
        soft_labels=bool(listed.soft),
        grey_to_one=True,
    )


# ---------------------------------------------------------------------------------------------------------------------
# Dataset objects: CIFAR, torchvision by name
# ---------------------------------------------------------------------------------------------------------------------


def dataset_source(name: str, train_ds, n_val: int, in_chans: int = 3) -> DataSource:
    """A torchvision dataset object (its __getitem__ gives a PIL image and a label). File-backed datasets are read
    like a folder (headers, then the file); array-backed ones (CIFAR, the MNIST family) hand out their images."""
    from vit.data.torchvision_data import _files, _targets

    targets = _targets(train_ds)
    paths = _files(train_ds)[0]
    if paths:
        header = lambda i: _file_header(paths[i])  # noqa: E731
        image = lambda i: _file_image(paths[i])  # noqa: E731
    else:

        def image(i: int) -> Image.Image | None:
            img = train_ds[i][0]
            return convert_image(img) if isinstance(img, Image.Image) else None

        def header(i: int) -> tuple[int, int, bool] | None:
            img = train_ds[i][0]
            return (img.size[0], img.size[1], is_gray(img)) if isinstance(img, Image.Image) else None

    num_classes = len(getattr(train_ds, "classes", None) or []) or int(targets.max()) + 1
    return DataSource(
        name=name,
        n_train=len(targets),
        n_val=n_val,
        class_counts=torch.bincount(targets, minlength=num_classes).tolist(),
        n_items=len(targets),
        label=lambda i: int(targets[i]),
        header=header,
        image=image,
        decodes=bool(paths),
        in_chans=in_chans,
    )


def cifar_source(dataset: str = "cifar10", root: str = "data", download: bool = True) -> DataSource:
    train = open_cifar(dataset, root, True, download=download)
    val = open_cifar(dataset, root, False, download=download)
    return dataset_source(f"{dataset} in {root}/", train, len(val))


def torchvision_source(dataset: str, root: str = "data", download: bool = True, to_rgb: bool = False) -> DataSource:
    from vit.data.torchvision_data import SPLIT_BY_TRAIN, _targets, open_split, resolve

    name, cls, splits = resolve(dataset)
    train_kwargs, val_kwargs = splits or SPLIT_BY_TRAIN
    train = open_split(name, cls, train_kwargs, Path(root), download)
    val = open_split(name, cls, val_kwargs, Path(root), download)
    # the MNIST family trains on one channel unless to_rgb (TorchvisionDataModule's rule)
    data = getattr(train, "data", None)
    gray_arrays = isinstance(data, torch.Tensor) and data.ndim == 3
    return dataset_source(f"torch/{name} in {root}/", train, len(_targets(val)), 1 if gray_arrays and not to_rgb else 3)


# ---------------------------------------------------------------------------------------------------------------------
# litdata streams
# ---------------------------------------------------------------------------------------------------------------------


def stream_source(input_dir: str, cache_dir: str | None = None, trust_pickles: bool = False) -> DataSource:
    """litdata chunks written by `python -m vit.commands.streaming optimize`: the items hold the encoded file and
    its label. Counts come from vit_meta.json where the optimize command recorded them, else from a seeded sample
    of STREAM_LABEL_SAMPLE items."""
    from litdata import StreamingDataset

    from vit.data.streaming import META, read_meta, refuse_pickled_items

    input_dir = input_dir.rstrip("/")
    if "://" not in input_dir and not Path(input_dir, META).is_file():
        raise DataError(
            f"{input_dir}/{META}: not found; write the chunks with: python -m vit.commands.streaming optimize ROOT OUT"
        )
    meta = read_meta(f"{input_dir}/{META}")
    if not trust_pickles:  # reading an item unpickles it: the same refusal as the DataModule's, before any read
        for split in ("train", "val"):
            refuse_pickled_items(f"{input_dir}/{split}/index.json", read_meta)
    train = StreamingDataset(f"{input_dir}/train", cache_dir=cache_dir)
    n_val = len(StreamingDataset(f"{input_dir}/val", cache_dir=cache_dir))
    n, classes = len(train), len(meta["class_names"])

    def item(i: int) -> dict:
        return train[i]

    counts = meta.get("class_counts")
    if counts is None:
        pick = torch.randperm(n, generator=torch.Generator().manual_seed(0))[:STREAM_LABEL_SAMPLE].tolist()
        seen = torch.bincount(torch.tensor([int(item(i)["label"]) for i in pick]), minlength=classes)
        counts = [max(1, round(c * n / len(pick))) for c in seen.tolist()]

    def image(i: int) -> Image.Image | None:
        return _file_image(io.BytesIO(item(i)["data"]))

    def header(i: int) -> tuple[int, int, bool] | None:
        return _file_header(io.BytesIO(item(i)["data"]))

    return DataSource(
        name=input_dir,
        n_train=n,
        n_val=n_val,
        class_counts=list(counts),
        n_items=n,
        label=lambda i: int(item(i)["label"]),
        header=header,
        image=image,
        decodes=False,  # decoded by the loader's workers inside each epoch: the timed epochs say what it costs
    )


# ---------------------------------------------------------------------------------------------------------------------
# From a parsed config
# ---------------------------------------------------------------------------------------------------------------------

PLANNED = {
    "vit.data.ImageFolderDataModule": "a folder (--data.root PATH)",
    "vit.data.CIFARDataModule": "CIFAR-10/100",
    "vit.data.TorchvisionDataModule": "torch/NAME",
    "vit.data.StreamingDataModule": "litdata chunks",
}


def public_class_path(path: str | None) -> str | None:
    """A DataModule's class path as vit.data.<Name> (the path configs name), whichever module path `path` uses
    (vit.data.folder.ImageFolderDataModule, or vit.datasets.TorchvisionDataModule of a file older than the split);
    `path` itself for any other class."""
    import vit.data

    module, _, name = (path or "").rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name, None) if module else None
    except ImportError:
        return path
    return f"vit.data.{name}" if name in vit.data.HOMES and cls is getattr(vit.data, name) else path


def source_for(data) -> DataSource:
    """The source a parsed `data:` config (class_path, init_args) names; ValueError for a DataModule the planner does
    not read (the built-in digits, a class of your own)."""
    path, init = public_class_path(data.get("class_path")), data.get("init_args") or {}
    get = lambda key, default=None: init.get(key, default) if init.get(key) is not None else default  # noqa: E731
    if path == "vit.data.ImageFolderDataModule":
        listing = {k: get(k) for k in ("labels", "path_column", "label_column", "group_by", "label_delimiter")}
        listing.update(split_column=get("split_column", "split"), group_column=get("group_column", "group"))
        return folder_source(get("root"), val_fraction=get("val_fraction", 0.2), **listing)
    if path == "vit.data.CIFARDataModule":
        return cifar_source(get("dataset", "cifar10"), get("root", "data"), get("download", True))
    if path == "vit.data.TorchvisionDataModule":
        return torchvision_source(
            get("dataset", "torch/mnist"), get("root", "data"), get("download", True), get("to_rgb", False)
        )
    if path == "vit.data.StreamingDataModule":
        return stream_source(get("input_dir", "chunks"), get("cache_dir"), get("trust_pickles", False))
    raise ValueError(
        f"--budget and plan: true plan {', '.join(PLANNED.values())}; not {path}, whose config has a fixed recipe: "
        "set --trainer.max_epochs instead"
    )
