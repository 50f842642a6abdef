"""What a user's data is, read once: its classes and, per split, the (path, class) of every image, with the group each
image belongs to. Every reader of a user's folder (the DataModule, the planner's source, vit-eval) lists it here.

    listing = list_data("photos/")                               # class folders, split folders, or ...
    listing = list_data("photos/", labels="photos/labels.csv")   # ... a labels file: path, label[, split][, group]
    train, val = split_validation(listing.splits["train"], 0.2, seed=0, groups=listing.groups)  # vit/data/val_split.py

Layouts, with timm's and Hugging Face's split names:
    root/<class>/*                                    validation split off the training images by the toolkit
    root/train/<class>/* + root/val/<class>/*         validation given (val, valid, validation, eval, evaluation)
    root/train/<class>/* + root/test/<class>/*        a test split (Kaggle's, Ultralytics'): validation split off train
    root/train + root/val + root/test                 all three given
A test split is never used to choose anything: it is scored once at the end of fit and by `vit-train test`.
"""

from __future__ import annotations

import csv
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes

from vit.data.files import SPLIT_NAMES, class_files
from vit.data.transforms import DataError

log = logging.getLogger(__name__)

# A labels file's columns when not named by flag: Hugging Face imagefolder's metadata.csv (file_name, label),
# fastai's from_csv (fname, labels), Kaggle's and annotation tools' usual names.
PATH_COLUMNS = ("file_name", "path", "filename", "file", "fname", "image", "image_path", "filepath", "name", "id")
LABEL_COLUMNS = ("label", "labels", "class", "target", "category", "class_name", "probability")


@dataclass
class Listing:
    """A user's data as listed: class names (sorted), and per split [(path, class index)]; "train" always, "val" and
    "test" when the layout or the labels file gives them. groups: path -> group name for images that share one (a
    labels file's group column, or data.group_by); an image without one is a group of its own. soft: path -> the
    probability of each class, where the labels file gives probabilities (the class index is the likeliest). multi:
    path -> its labels, where an image has several (the class index is its rarest label)."""

    class_names: list[str]
    splits: dict[str, list[tuple[str, int]]]
    groups: dict[str, str] = field(default_factory=dict)
    found: str = ""
    soft: dict[str, tuple[float, ...]] = field(default_factory=dict)
    multi: dict[str, tuple[int, ...]] = field(default_factory=dict)


def split_dirs(root: Path) -> dict[str, Path]:
    """The split folders of root ({"train": root/train, "val": ..., "test": ...}), or {} for one folder of classes.
    A layout that cannot be read one way only is a DataError naming what was found."""
    found = {s: [root / n for n in names if (root / n).is_dir()] for s, names in SPLIT_NAMES.items()}
    for split, dirs in found.items():
        if len(dirs) > 1:
            raise DataError(f"{root}: {' and '.join(d.name + '/' for d in dirs)} are both {split} splits: keep one")
    dirs = {s: d[0] for s, d in found.items() if d}
    if not dirs:
        return {}
    if "train" not in dirs:
        named = ", ".join(f"{d.name}/" for d in dirs.values())
        raise DataError(
            f"{root}: {named} found but no train/ (training, train) folder: add root/train/<class>/, or rename "
            f"{named} if it is a class"
        )
    others = sorted(p.name for p in root.iterdir() if p.is_dir() and p not in dirs.values() and p.name[0] != ".")
    if others:
        raise DataError(
            f"{root}: split folders {', '.join(d.name + '/' for d in dirs.values())} beside other folders {others}: "
            "put every class inside the split folders"
        )
    return dirs


def list_folder(root: Path) -> Listing:
    """Class folders under root, or under its split folders (split_dirs): classes are the training folder's."""
    dirs = split_dirs(root) or {"train": root}
    train_dir = dirs["train"]
    try:
        classes, to_idx = find_classes(str(train_dir))
    except FileNotFoundError:
        raise DataError(f"{train_dir}: no class subfolders (expected {train_dir}/<class>/<image>)") from None
    splits = {}
    for split, folder in dirs.items():
        if split != "train":
            try:
                unknown = sorted(set(find_classes(str(folder))[0]) - set(classes))
            except FileNotFoundError:
                raise DataError(f"{folder}: no class subfolders (expected {folder}/<class>/<image>)") from None
            if unknown:
                raise DataError(f"{folder}: classes {unknown} are not in {train_dir}")
    for split, folder in dirs.items():
        splits[split] = class_files(folder, to_idx)
        if not splits[split]:
            raise DataError(f"{folder}: no images with extensions {IMG_EXTENSIONS}")
    found = " + ".join(f"{d.relative_to(root)}/" if d != root else "class folders" for d in dirs.values())
    return Listing(classes, splits, {}, found)


def list_data(
    root: str | Path,
    labels: str | Path | None = None,
    path_column: str | None = None,
    label_column: str | None = None,
    split_column: str = "split",
    group_column: str = "group",
    group_by: str | None = None,
    strict: bool = False,
    label_delimiter: str | None = None,
) -> Listing:
    """The listing of a folder (list_folder) or of a labels file (read_labels); group_by (a regular expression
    searched in each path relative to root; its first group, or the whole match, names the image's group) adds
    groups to either."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"data.root={str(root)!r} is not a folder")
    if labels is not None:
        listing = read_labels(
            root, Path(labels), path_column, label_column, split_column, group_column, strict, label_delimiter
        )
    else:
        listing = list_folder(root)
    if group_by:
        listing.groups = groups_by_pattern(root, [p for items in listing.splits.values() for p, _ in items], group_by)
    return listing


def groups_by_pattern(root: Path, paths: list[str], pattern: str) -> dict[str, str]:
    """path -> group: the first group of `pattern` (or the whole match) searched in the path relative to root."""
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise DataError(f"data.group_by={pattern!r} is not a regular expression: {e}") from None
    groups, unmatched = {}, 0
    for p in paths:
        rel = Path(p).relative_to(root).as_posix() if Path(p).is_relative_to(root) else Path(p).as_posix()
        m = rx.search(rel)
        if m is None:
            unmatched += 1
            continue
        groups[p] = m.group(1) if rx.groups else m.group(0)
    if unmatched == len(paths):
        raise DataError(f"data.group_by={pattern!r} matches none of the {len(paths)} paths (e.g. {paths[0]!r})")
    if unmatched:
        log.warning(f"data.group_by={pattern!r}: {unmatched} of {len(paths)} paths match nothing: a group each")
    return groups


# ---------------------------------------------------------------------------------------------------------------------
# A labels file
# ---------------------------------------------------------------------------------------------------------------------


def _split_of(value: str) -> str | None:
    v = value.strip().lower()
    return next((s for s, names in SPLIT_NAMES.items() if v in names), None)


def _column(header: list[str], given: str | None, candidates: tuple[str, ...], what: str, flag: str, src: Path) -> str:
    if given is not None:
        if given not in header:
            raise DataError(f"{src}: no column {given!r} ({flag}); the columns are {header}")
        return given
    lower = {h.lower(): h for h in header}
    found = next((lower[c] for c in candidates if c in lower), None)
    if found is None:
        raise DataError(f"{src}: no {what} column among {header}: name it with {flag}")
    return found


def read_labels(
    root: Path,
    src: Path,
    path_column: str | None = None,
    label_column: str | None = None,
    split_column: str = "split",
    group_column: str = "group",
    strict: bool = False,
    label_delimiter: str | None = None,
) -> Listing:
    """A CSV (or TSV: .tsv/.tab) with a path column (relative to root, or absolute), a label column, and optional
    split and group columns. A row with no path, a file that is not there, an empty label or a second row for the
    same path is one warning line naming the row, and skipped (strict: a DataError instead); a path given two labels,
    a split value not known, or a class only outside train stops the run. With `label_delimiter` the label column
    holds a list ("crack finger", fastai's label_delim): several labels an image (Listing.multi). Several label
    columns (`label_column` "a,b,c") hold a number per class: 0/1 flags (several labels an image) or probabilities
    that sum to 1 (a distribution: soft targets), the columns naming the classes."""
    header, rows = _read_table(src)
    path_col = _column(header, path_column, PATH_COLUMNS, "path", "--data.path_column", src)
    names = [c.strip() for c in label_column.split(",")] if label_column and "," in label_column else [label_column]
    label_cols = [_column(header, c, LABEL_COLUMNS, "label", "--data.label_column", src) for c in names]
    split_col = split_column if split_column in header else None
    group_col = group_column if group_column in header else None
    kept, problems = _check_rows(root, src, rows, path_col, label_cols, split_col, group_col)
    if problems:
        listing = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        if strict:
            raise DataError(f"{src}: {len(problems)} bad row(s) and strict=true: {listing}")
        for p in problems:
            log.warning(f"skipping {p}")
    if not any(row.split == "train" for row in kept):
        raise DataError(f"{src}: no usable training row ({len(rows)} rows, {len(problems)} skipped)")
    if len(label_cols) > 1:
        return _columns_listing(src, kept, label_cols)
    return _label_listing(src, kept, label_cols[0], label_delimiter)


@dataclass
class _Row:
    path: str
    label: str  # one label column's value, or several columns' values joined by ","
    split: str
    group: str | None
    where: str  # file:line, for errors


def _read_table(src: Path) -> tuple[list[str], list[dict]]:
    """(header, rows) of a CSV, or a TSV by its suffix (.tsv, .tab)."""
    if not src.is_file():
        raise DataError(f"data.labels={str(src)!r}: no such file")
    delimiter = "\t" if src.suffix.lower() in (".tsv", ".tab") else ","
    with open(src, newline="", encoding="utf-8-sig") as f:  # utf-8-sig: Excel's CSVs start with a byte-order mark
        reader = csv.DictReader(f, delimiter=delimiter)
        header = [h.strip() for h in (reader.fieldnames or [])]
        if not header:
            raise DataError(f"{src}: empty file (expected a header row: path,label)")
        reader.fieldnames = header
        return header, list(reader)


def _check_rows(root, src, rows, path_col, label_cols, split_col, group_col) -> tuple[list[_Row], list[str]]:
    """The usable rows, and a line naming each row skipped (no path, empty label, duplicate, no such file)."""
    problems: list[str] = []
    seen: dict[str, tuple[int, str]] = {}  # path -> (line, label)
    kept: list[_Row] = []
    for line, row in enumerate(rows, start=2):  # line 1 is the header
        where = f"{src}:{line}"
        rel = (row.get(path_col) or "").strip()
        cells = [(row.get(c) or "").strip() for c in label_cols]
        if not rel:
            problems.append(f"{where}: no path in column {path_col!r}")
            continue
        path = Path(rel) if Path(rel).is_absolute() else root / rel
        if not all(cells):
            empty = next(c for c, v in zip(label_cols, cells) if not v)
            problems.append(f"{where}: {rel}: empty label in column {empty!r}")
            continue
        key, label = str(path), ",".join(cells)
        if key in seen:
            first, first_label = seen[key]
            if first_label != label:
                raise DataError(f"{where}: {rel} is labelled {label!r} here and {first_label!r} on line {first}")
            problems.append(f"{where}: {rel}: duplicate of line {first}")
            continue
        if not path.is_file():
            problems.append(f"{where}: {rel}: " + ("not a file" if path.exists() else f"no such file under {root}"))
            continue
        split = "train"
        if split_col and (value := (row.get(split_col) or "").strip()):
            split = _split_of(value)
            if split is None:
                known = sorted({n for names in SPLIT_NAMES.values() for n in names})
                raise DataError(f"{where}: split {value!r} is none of {known}")
        group = ((row.get(group_col) or "").strip() or None) if group_col else None
        seen[key] = (line, label)
        kept.append(_Row(key, label, split, group, where))
    return kept, problems


def _label_listing(src: Path, kept: list[_Row], label_col: str, label_delimiter: str | None) -> Listing:
    """One label column: a class name, a probability (soft targets, classes "0" and "1"), or a delimited list."""
    probabilities = _probabilities([r.label for r in kept]) if label_delimiter is None else None
    soft = {}
    if probabilities is not None:  # one probability per image: the positive class's, thresholded at 0.5 for the label
        soft = {r.path: (1.0 - p, p) for r, p in zip(kept, probabilities)}
        for r, p in zip(kept, probabilities):
            r.label = str(int(p >= 0.5))
    if label_delimiter is None:
        labels = {r.path: [r.label] for r in kept}
    else:  # several labels an image: every name in the list is a class
        labels = {r.path: [v.strip() for v in r.label.split(label_delimiter) if v.strip()] for r in kept}
        if empty := next((r for r in kept if not labels[r.path]), None):
            raise DataError(f"{empty.where}: {empty.label!r} holds no label between {label_delimiter!r}")
    classes = sorted({n for r in kept if r.split == "train" for n in labels[r.path]})
    outside = sorted({n for r in kept if r.split != "train" for n in labels[r.path]} - set(classes))
    if outside:
        raise DataError(f"{src}: classes {outside} appear in val/test rows but in no training row")
    to_idx = {c: i for i, c in enumerate(classes)}
    indices = {p: tuple(sorted({to_idx[n] for n in names})) for p, names in labels.items()}
    listing = _listing(src, kept, classes, indices, soft, multi=label_delimiter is not None)
    if soft:
        listing.found += f"; column {label_col!r} holds probabilities: soft targets, classes 0 / 1 at p >= 0.5"
    if label_delimiter is not None:
        listing.found += f"; {label_delimiter!r}-separated labels: multi-label, {len(classes)} labels"
    return listing


def _columns_listing(src: Path, kept: list[_Row], label_cols: list[str]) -> Listing:
    """A number per class in its own column (the columns name the classes, in their order): 0/1 flags that are not
    all one-hot are several labels an image; rows that each sum to 1 are a distribution (soft targets when some
    value lies strictly between 0 and 1; one-hot rows are plain class labels)."""
    values = {}
    for r in kept:
        try:
            values[r.path] = [float(v) for v in r.label.split(",")]
        except ValueError:
            raise DataError(f"{r.where}: {r.label!r} in columns {label_cols}: expected a number per column") from None
        if any(not 0.0 <= v <= 1.0 for v in values[r.path]):
            raise DataError(f"{r.where}: {r.label!r} in columns {label_cols}: values must lie in [0, 1]")
    flags = all(v in (0.0, 1.0) for vs in values.values() for v in vs)
    sums_to_one = all(abs(sum(vs) - 1.0) < 1e-3 for vs in values.values())
    if flags and not sums_to_one:  # several labels an image
        indices = {p: tuple(c for c, v in enumerate(vs) if v) for p, vs in values.items()}
        for r in kept:
            if not indices[r.path]:
                raise DataError(f"{r.where}: no label set in columns {label_cols}")
        listing = _listing(src, kept, label_cols, indices, {}, multi=True)
        listing.found += f"; 0/1 columns {label_cols}: multi-label"
        return listing
    if not sums_to_one:  # the first row that is neither 0/1 flags nor a distribution, else the first fraction
        is_flags = lambda r: all(v in (0.0, 1.0) for v in values[r.path])  # noqa: E731
        bad = next((r for r in kept if not is_flags(r) and abs(sum(values[r.path]) - 1.0) >= 1e-3), None)
        bad = bad or next(r for r in kept if not is_flags(r))
        raise DataError(
            f"{bad.where}: {bad.label!r} in columns {label_cols} sums to {sum(values[bad.path]):g}: give 0/1 flags "
            "(several labels an image) or probabilities that sum to 1 in every row"
        )
    indices = {p: (max(range(len(vs)), key=vs.__getitem__),) for p, vs in values.items()}  # the likeliest class
    soft = {} if flags else {p: tuple(vs) for p, vs in values.items()}
    listing = _listing(src, kept, label_cols, indices, soft, multi=False)
    listing.found += f"; columns {label_cols}: " + ("one-hot classes" if flags else "a distribution: soft targets")
    return listing


def _listing(src, kept: list[_Row], classes, indices: dict, soft: dict, multi: bool) -> Listing:
    """The Listing of checked rows whose class indices are known (several for multi-label: the split and the plots
    take each image's rarest label)."""
    if multi:
        counts = [0] * len(classes)
        for labels in indices.values():
            for c in labels:
                counts[c] += 1
        index = {p: min(labels, key=lambda c: (counts[c], c)) for p, labels in indices.items()}
    else:
        index = {p: labels[0] for p, labels in indices.items()}
    splits: dict[str, list[tuple[str, int]]] = {}
    for r in kept:
        splits.setdefault(r.split, []).append((r.path, index[r.path]))
    groups = {r.path: r.group for r in kept if r.group is not None}
    found = f"{src.name} ({', '.join(f'{len(v)} {k}' for k, v in splits.items())})"
    return Listing(list(classes), splits, groups, found, soft, indices if multi else {})


def _probabilities(labels: list[str]) -> list[float] | None:
    """The labels as probabilities when every one is a number in [0, 1] and some lie strictly between (a label
    column of 0 and 1 alone is two classes, "0" and "1"); else None."""
    try:
        values = [float(v) for v in labels]
    except ValueError:
        return None
    if not all(0.0 <= v <= 1.0 for v in values) or all(v in (0.0, 1.0) for v in values):
        return None
    return values
