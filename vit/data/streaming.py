"""Datasets larger than one machine's memory: an image folder converted once to litdata's chunks (local or object
storage), then streamed with per-rank sharding under DDP.

    python -m vit.commands.streaming optimize path/to/images chunks/          # root/train/<class>/*, root/val/<class>/*
    python train.py --config configs/streaming.yaml --data.init_args.input_dir chunks/

(`input_dir` may be `s3://bucket/prefix` once the chunks are uploaded there: litdata reads object storage and keeps a
capped local cache.) The chunks hold the original encoded files, so optimize is a copy, not a decode; images are
decoded, resized and augmented per image in the DataLoader workers with torchvision's transforms, as on the streaming
path of vit/data/transforms.py. Each rank reads its own share of the chunks: every image once per epoch across ranks
(tested under 2-process DDP). litdata shuffles by chunk, then within a window, not globally (a limitation its
maintainers document in the Lightning-AI/litData tracker).
"""

import io
import json
import multiprocessing
from pathlib import Path

import torch

from vit.data.base import ImageClassificationData, channel_mean_std, rounded
from vit.data.images import eval_geometry, load_image, same_dtype
from vit.data.listing import list_folder
from vit.data.transforms import Augmentation, check_crop_scale, eval_transform, train_transform
from vit.data.val_split import split_validation

META = "vit_meta.json"  # class names and the training images' mean/std, written beside the chunks


def _read(item: tuple[str, int, int]) -> dict:
    path, label, index = item
    return {"data": Path(path).read_bytes(), "label": label, "index": index}


def read_meta(path: str) -> dict:
    """vit_meta.json, local or remote (`s3://...`, through fsspec)."""
    if "://" not in path:
        return json.loads(Path(path).read_text())
    import fsspec

    with fsspec.open(path, "r") as f:
        return json.load(f)


VAL_FRACTION = 0.2  # of each class, for a folder without val/: what a folder's DataModule holds out by default


def optimize_folder(root: str, output_dir: str, num_workers: int = 1, chunk_bytes: str = "64MB") -> dict:
    """Write root/train and root/val (class subfolders; a root/<class>/ folder is split, VAL_FRACTION of each class to
    val, seeded) as litdata chunks under output_dir/{train,val}; returns the
    metadata also written to output_dir/vit_meta.json (class names, mean and std of 500 training images)."""
    from litdata import optimize

    root_p, out = Path(root), Path(output_dir)
    listing = list_folder(root_p)
    splits = dict(listing.splits)
    if "val" not in splits:  # root/<class>/ (or train/ alone): validation split off per class, seeded, as a folder's
        splits["train"], splits["val"] = split_validation(splits["train"], VAL_FRACTION, seed=0)
    classes = listing.class_names
    for split in ("train", "val"):
        items = [(p, t, i) for i, (p, t) in enumerate(splits[split])]
        optimize(
            fn=_read,
            inputs=items,
            output_dir=str(out / split),
            chunk_bytes=chunk_bytes,
            num_workers=num_workers,
            mode="overwrite",
            verbose=False,
            # litdata forces "spawn" process-wide (multiprocessing.set_start_method(force=True)) unless told: each
            # worker then re-imports torch (10 s a worker on a 2-core CPU; optimize took 39 s for 36 files), and every
            # later DataLoader of the process spawns too. The platform's own method keeps both as they were.
            start_method=multiprocessing.get_start_method(),
        )
    train_files = splits["train"]
    sample = [p for p, _ in train_files[:: max(1, len(train_files) // 500)][:500]]
    # the same statistics as a folder's (channel_mean_std), of a stride sample decoded at 64 px (the chunks keep the
    # encoded files; the size to train at is not known here)
    x = torch.stack(same_dtype([eval_geometry(64)(load_image(p)) for p in sample]))  # (N, 3, 64, 64), uint8 or float
    mean, std = channel_mean_std(x)
    train_labels = [t for _, t in train_files]
    meta = {
        "class_names": classes,
        # the planner's fingerprint reads the counts here instead of every item of the stream (vit/data/sources.py)
        "class_counts": [train_labels.count(i) for i in range(len(classes))],
        "mean": list(rounded(mean.tolist())),  # as the folder's DataModule measures them
        "std": list(rounded(std.tolist())),
    }
    (out / META).write_text(json.dumps(meta, indent=1) + "\n")
    return meta


class _Decode:
    """Bytes of an image file -> (transformed tensor, label): runs in the DataLoader's workers."""

    def __init__(self, transform):
        self.transform = transform

    def __call__(self, item: dict):
        img = load_image(io.BytesIO(item["data"]))
        return self.transform(img), item["label"]


def refuse_pickled_items(index: str, read_remote) -> None:
    """litdata stores any item it has no serializer for as a pickle, and unpickles it when streaming: chunks from
    elsewhere whose index names the pickle serializer are code, not data. DataError unless the user trusts them."""
    if "://" not in index and not Path(index).is_file():
        return  # litdata reports the missing split itself
    config = (json.loads(Path(index).read_text()) if "://" not in index else read_remote(index)).get("config") or {}
    formats = config.get("data_format") or []
    if any("pickle" in str(f) for f in formats):
        from vit.data.transforms import DataError

        raise DataError(
            f"{index}: its items are pickles ({formats}), which run code when read; this toolkit's optimize writes "
            "bytes and ints only. If you wrote these chunks yourself, pass --data.init_args.trust_pickles true"
        )


class StreamingDataModule(ImageClassificationData):
    """Stream litdata chunks written by `python -m vit.commands.streaming optimize` (local folder or object storage).

    Args:
        input_dir: the optimize output (holds train/, val/ and vit_meta.json).
        cache_dir: local cache for remote chunks (litdata's default when None); max_cache_size caps it.
        trust_pickles: stream chunks whose items litdata stored as pickles (code run when read); refused otherwise.
        crop_scale, random_erasing: RandomResizedCrop's share of the area and Random Erasing's probability.
        rot90: a random quarter turn of each training image (square images).
    """

    def __init__(
        self,
        input_dir: str,
        img_size: int = 64,
        batch_size: int = 64,
        num_workers: int = 2,
        hflip: bool = True,
        auto_augment: str = "none",
        cache_dir: str | None = None,
        max_cache_size: str = "50GB",
        eval_batch_size: int | None = None,
        trust_pickles: bool = False,
        crop_scale: tuple[float, float] = (0.35, 1.0),
        random_erasing: float = 0.0,
        rot90: bool = False,
    ):
        super().__init__(batch_size, num_workers, eval_batch_size=eval_batch_size)
        crop_scale = check_crop_scale(crop_scale)
        if not 0.0 <= random_erasing <= 1.0:
            raise ValueError(f"random_erasing={random_erasing} must be a probability in [0, 1]")
        self.input_dir, self.cache_dir, self.max_cache_size = input_dir.rstrip("/"), cache_dir, max_cache_size
        meta_path = f"{self.input_dir}/{META}"
        if "://" not in meta_path and not Path(meta_path).is_file():
            from vit.data.transforms import DataError

            raise DataError(
                f"{meta_path}: not found; write the chunks with: python -m vit.commands.streaming optimize ROOT OUT"
            )
        meta = read_meta(meta_path)
        if not trust_pickles:
            for split in ("train", "val"):
                refuse_pickled_items(f"{self.input_dir}/{split}/index.json", read_meta)
        self.class_names, self.num_classes = meta["class_names"], len(meta["class_names"])
        self.mean, self.std = tuple(meta["mean"]), tuple(meta["std"])
        self.img_size, self.in_chans = img_size, 3
        self.augmentation = Augmentation(
            hflip=hflip, rot90=rot90, rrc_scale=crop_scale, auto_augment=auto_augment, erasing=random_erasing
        )
        self.train_tf = train_transform(img_size, self.mean, self.std, self.augmentation)
        self.eval_tf = eval_transform(img_size, self.mean, self.std)
        self._loaders: list = []  # the loaders handed out, whose workers teardown stops

    def _stream(self, split: str, transform, shuffle: bool):
        from litdata import StreamingDataLoader, StreamingDataset

        ds = StreamingDataset(
            f"{self.input_dir}/{split}",
            cache_dir=self.cache_dir,
            max_cache_size=self.max_cache_size,
            shuffle=shuffle,
            # training: every rank the same number of batches (else DDP's all-reduce waits forever; litdata warns);
            # validation: every image once (no gradient all-reduce there; the metrics sync once, at the end)
            drop_last=split == "train",
            transform=_Decode(transform),
        )
        batch = self.batch_size if split == "train" else self.eval_batch_size
        # persistent: the workers start once per run, not at every epoch and validation (each start re-imports torch
        # in a fresh process: 5-10 s on a 2-core CPU)
        loader = StreamingDataLoader(
            ds, batch_size=batch, num_workers=self.num_workers, persistent_workers=self.num_workers > 0
        )
        self._loaders.append(loader)
        return loader

    def teardown(self, stage: str) -> None:
        """Stop the stage's persistent workers now. litdata's loader and its iterator refer to each other, so they
        are freed later by the cycle collector, which can close the iterator's queues before the iterator asks its
        workers to exit: each worker is then waited for 5 s and killed (measured: a 10.3 s stall at some later
        collection with 2 workers, against 0.01 s here, while the queues live)."""
        for loader in self._loaders:
            iterator, loader._iterator = loader._iterator, None
            if iterator is not None and hasattr(iterator, "_shutdown_workers"):
                iterator._shutdown_workers()
        self._loaders.clear()

    def train_dataloader(self):
        return self._stream("train", self.train_tf, shuffle=True)

    def val_dataloader(self):
        return self._stream("val", self.eval_tf, shuffle=False)

    def test_dataloader(self):
        return self.val_dataloader()
