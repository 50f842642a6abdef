"""The validation split of a user's data (stratified by class, no group on both sides), and the split.csv a run writes
so that `--data.labels` reads the same split back.

    train, val = split_validation(listing.splits["train"], 0.2, seed=0, groups=listing.groups)
    write_split(log_dir / "split.csv", root, {"train": train, "val": val}, listing)
"""

from __future__ import annotations

import csv
import os
import random
from pathlib import Path

from vit.data.listing import Listing
from vit.data.transforms import DataError


def split_validation(
    items: list[tuple[str, int]],
    fraction: float,
    seed: int,
    groups: dict[str, str] | None = None,
    multi: dict[str, tuple[int, ...]] | None = None,
) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(train, val) of items: about `fraction` of each class in val (a class of 2 images or more keeps at least one
    there), whole groups on one side only. Groups are visited in a seeded random order and a group goes to val when it
    brings val's per-class counts closer to their targets (with one image a group, that is a stratified split; with
    several labels an image (`multi`, path -> labels) every label is counted: a greedy form of iterative
    stratification). The same items, fraction and seed give the same split on every machine (seeded Random)."""
    groups, multi = groups or {}, multi or {}
    labels = [multi.get(p, (t,)) for p, t in items]
    num_classes = max(max(ls) for ls in labels) + 1
    counts = [0] * num_classes
    for ls in labels:
        for t in ls:
            counts[t] += 1
    target = class_quotas(counts, fraction)
    members: dict[str, list[int]] = {}
    for i, (p, _) in enumerate(items):
        members.setdefault(groups.get(p, f"\0{p}"), []).append(i)
    order = sorted(members)
    random.Random(seed).shuffle(order)
    in_val, have = set(), [0] * num_classes
    for g in order:
        add: dict[int, int] = {}
        for i in members[g]:
            for t in labels[i]:
                add[t] = add.get(t, 0) + 1
        # the change in sum_c |target_c - have_c| if g went to val (only g's classes move)
        change = sum(abs(target[c] - have[c] - a) - abs(target[c] - have[c]) for c, a in add.items())
        if change < 0:
            in_val.update(members[g])
            for c, a in add.items():
                have[c] += a
    if not in_val or len(in_val) == len(items):
        raise DataError(
            f"{len(items)} images in {len(members)} group(s) are too few to split with val_fraction={fraction}"
        )
    train = [it for i, it in enumerate(items) if i not in in_val]
    val = [it for i, it in enumerate(items) if i in in_val]
    return train, val


def class_quotas(counts: list[int], fraction: float) -> list[int]:
    """Validation images per class: `fraction` of the whole set (rounded) shared out in proportion to the classes
    (largest remainders first), and at least one for every class of 2 images or more."""
    exact = [n * fraction for n in counts]
    quota = [int(e) for e in exact]
    left = max(1, round(sum(counts) * fraction)) - sum(quota)
    for c in sorted(range(len(counts)), key=lambda c: quota[c] - exact[c])[: max(0, left)]:
        quota[c] += 1
    return [max(1, min(q, n - 1)) if n >= 2 else 0 for q, n in zip(quota, counts)]


def write_split(path: Path, root: Path, samples: dict[str, list[tuple[str, int]]], listing: Listing) -> None:
    """path (relative to root), label(s), split of every image a run uses (split.csv beside its logs): a labels file
    that `--data.labels` reads back as the same split and the same targets: a class name; several, space-separated
    (`--data.label_delimiter ' '`; ';' where a label holds a space); a probability; or a column per class, for a
    distribution or for 0/1 flags (`--data.label_column` naming them, as the run's labels file did)."""
    names, soft, multi = listing.class_names, listing.soft, listing.multi
    delimiter = ";" if any(" " in n for n in names) else " "
    # a column per class for a distribution, and for flags whose classes are not in sorted order (a list is read
    # back sorted)
    as_columns = (soft and names != ["0", "1"]) or (multi and names != sorted(names))
    columns = list(names) if as_columns else ["label"]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["path", *columns, "split"])
        for split, items in samples.items():
            for p, t in items:
                if multi and as_columns:
                    label = [str(int(c in multi[p])) for c in range(len(names))]
                elif multi:
                    label = [delimiter.join(names[c] for c in multi[p])]
                elif soft and len(columns) > 1:
                    label = [repr(q) for q in soft[p]]
                elif soft:
                    label = [repr(soft[p][1])]  # the probability of class "1"
                else:
                    label = [names[t]]
                out.writerow([os.path.relpath(p, root), *label, split])
