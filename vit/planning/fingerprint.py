"""The dataset fingerprint: what the planner reads from a data source (counts, sides, channels, symmetries, decode
time), never its name."""

from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from vit.data.folder import one_channel
from vit.data.images import eval_geometry
from vit.data.sources import DataSource, folder_source
from vit.data.transforms import DataError


@dataclass
class Fingerprint:
    """What the planner knows about a data source, read from its counts, headers and a small decoded sample."""

    root: str  # the data, as the plan names it: a folder, `torch/mnist in data/`, ...
    n_train: int
    n_val: int
    class_counts: list[int]
    median_side: int  # median over files of min(height, width)
    min_side: int
    max_side: int
    grayscale: float  # fraction of files that are grayscale (modes L, LA, I, I;16, 1, or palettes of greys)
    mirror_symmetry: float  # see FLIP_SYMMETRY in plan.py
    decode_s: float  # measured seconds to decode the whole set once at start (threads); 0: held as arrays, streamed
    in_chans: int = 3  # channels the model trains on (1: a grayscale torchvision set)
    turn_symmetry: float = 0.0  # the same for a quarter turn: see TURN_SYMMETRY in plan.py
    task: str = "multiclass"  # "multilabel": several labels an image; class_counts are then per label
    soft_labels: bool = False  # the labels are class probabilities (a labels file's probability column)

    @property
    def num_classes(self) -> int:
        return len(self.class_counts)

    @property
    def balance(self) -> float:
        return min(self.class_counts) / max(self.class_counts)


def fingerprint(
    source: DataSource | str | Path, val_fraction: float = 0.2, sample: int = 2000, seed: int = 0
) -> Fingerprint:
    """What the plan needs to know about a data source (a folder path, or any DataSource of vit/data/sources.py): counts
    from the source, sizes and modes from up to `sample` seeded items (file headers where there are files), mirror
    symmetry and decode speed from up to 50 of those per class, decoded at 16 px in threads. A torchvision dataset
    and the same images as a folder give the same fingerprint."""
    src = folder_source(source, val_fraction) if isinstance(source, str | Path) else source
    g = torch.Generator().manual_seed(seed)
    pick = torch.randperm(src.n_items, generator=g)[:sample].tolist()
    headers = [h for h in (src.header(i) for i in pick) if h is not None]
    if not headers:
        raise DataError(f"{src.name}: none of {len(pick)} sampled images could be read")
    sides = sorted(min(w, h) for w, h, _ in headers)

    per_class: dict[int, list[int]] = {}
    for i in pick:
        idx = per_class.setdefault(src.label(i), [])  # one label read an item: a stream's reads fetch its chunk
        if len(idx) < 50:
            idx.append(i)
    items = [i for idx in per_class.values() for i in idx]
    labels = [t for t, idx in per_class.items() for _ in idx]
    geometry = eval_geometry(16)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 1) + 2)) as pool:  # PIL releases the GIL
        images = list(pool.map(lambda i: None if (im := src.image(i)) is None else geometry(im), items))
    per_image = (time.perf_counter() - t0) / max(1, len(items))
    return Fingerprint(
        root=src.name,
        n_train=src.n_train,
        n_val=src.n_val,
        class_counts=list(src.class_counts),
        median_side=int(statistics.median(sides)),
        min_side=sides[0],
        max_side=sides[-1],
        grayscale=sum(gray for *_, gray in headers) / len(headers),
        mirror_symmetry=mirror_symmetry(images, labels),
        turn_symmetry=mirror_symmetry(images, labels, turn=True),
        decode_s=per_image * (src.n_train + src.n_val) if src.decodes else 0.0,
        # a folder of grey images trains a 1-channel model (the DataModule checks every image; this, the sample)
        in_chans=channels(src, [im for im in images if im is not None]),
        task=src.task,
        soft_labels=src.soft_labels,
    )


def channels(src: DataSource, images: list[torch.Tensor]) -> int:
    """The channels the model trains on: a folder's (grey_to_one) 1 when its sample is grey, else its images' count
    (3, or a multi-band TIFF's bands), as the DataModule decides over every image; other sources' own."""
    if not src.grey_to_one:
        return src.in_chans
    return 1 if all(one_channel(im) for im in images) else len(images[0])


def mirror_symmetry(images: list[torch.Tensor | None], labels: list[int], turn: bool = False) -> float:
    """How much the classes look like their own mirror images: the class means minus the overall mean, d_c, against
    their left-right flips: sum_c <d_c, flip(d_c)> / sum_c |d_c|^2, in [-1, 1]. 1: every class is mirror-symmetric
    on average (flipping an image keeps it in its class); near 0 or below: the classes have a handedness. `turn`: the
    same against a quarter turn of d_c (what tells a tile or a slide, whose classes keep under turns, from a digit or
    a photo with an up). What the classes share (grid lines every image has, a photo's sky) is in the overall mean and
    cancels."""
    kept = [(img.float().mean(0), t) for img, t in zip(images, labels) if img is not None]
    if len(kept) < 2:
        return 1.0
    x = torch.stack([img for img, _ in kept])  # (N, 16, 16) grey
    y = torch.tensor([t for _, t in kept])
    overall = x.mean(0)
    num = den = 0.0
    for c in y.unique():
        d = x[y == c].mean(0) - overall
        num += float((d * (torch.rot90(d, 1, (-2, -1)) if turn else d.flip(-1))).sum())
        den += float((d * d).sum())
    return num / den if den > 0 else 1.0
