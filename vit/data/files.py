"""Files on disk: how a folder of a user's images is split and listed (one place for every reader of folders), and
what is wrong with a dataset's own files, in one line naming the file, for when torchvision fails to read them.

torchvision reads CIFAR's pickled batches and MNIST's idx files trusting their layout: a file in another layout ends in
a KeyError (`'data'`), an AssertionError or a reshape error three calls down, which jsonargparse then buries in a
report about Union types. These checks run only after such a failure, to say which file and what is wrong with it.
"""

import pickle
import struct
from pathlib import Path

import numpy as np
from torchvision.datasets import DatasetFolder
from torchvision.datasets.folder import IMG_EXTENSIONS

IDX_MAGIC = {2049: ("labels", 1), 2051: ("images", 3)}  # MNIST's big-endian magic number -> what it holds, dims


def cifar_problem(folder: Path, batches: list[str], meta: str, labels_key: str, names_key: str) -> str | None:
    """The first of CIFAR's files in `folder` that is not what torchvision reads ('path: what is wrong'), or None."""
    for name in [*batches, meta]:
        path = folder / name
        try:
            with open(path, "rb") as f:
                # CIFAR's format is a pickle by design (torchvision loads it the same way, as its authors ship it)
                record = pickle.load(f, encoding="latin1")
        except FileNotFoundError:
            return f"{path}: missing"
        except Exception as e:  # truncated, not a pickle, ...
            return f"{path}: not a CIFAR pickle ({type(e).__name__}: {e})"
        if not isinstance(record, dict):
            return f"{path}: holds a {type(record).__name__}, not CIFAR's dict"
        if any(isinstance(k, bytes) for k in record):
            return (
                f"{path}: its keys are bytes ({sorted(record)[:3]}...), as Python 3 pickles str keys written as "
                "bytes; the official files (Python 2 pickles) have str keys"
            )
        want = [names_key] if name == meta else ["data", labels_key]
        missing = [k for k in want if k not in record]
        if missing:
            return f"{path}: no key {missing[0]!r} (has {sorted(record)[:6]})"
        if name == meta:
            continue
        data = np.asarray(record["data"])
        if data.ndim != 2 or data.shape[1] != 3072:
            return f"{path}: data has shape {data.shape}, not (N, 3072) (32x32 RGB rows)"
        if len(record[labels_key]) != len(data):
            return f"{path}: {len(record[labels_key])} labels for {len(data)} images"
    return None


def idx_problem(path: Path) -> str | None:
    """What is wrong with an MNIST-style idx file (magic number, dimensions, size), or None."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        return f"{path}: {e.strerror or e}"
    if len(raw) < 8:
        return f"{path}: {len(raw)} bytes, too short for an idx header"
    magic = struct.unpack(">I", raw[:4])[0]
    if magic not in IDX_MAGIC:
        return f"{path}: magic number {magic:#x} is not an idx file's ({', '.join(hex(m) for m in IDX_MAGIC)})"
    what, nd = IDX_MAGIC[magic]
    if len(raw) < 4 + 4 * nd:
        return f"{path}: truncated header"
    dims = struct.unpack(f">{nd}I", raw[4 : 4 + 4 * nd])
    want = 4 + 4 * nd + int(np.prod(dims))
    if len(raw) != want:
        return f"{path}: {len(raw)} bytes, but its header ({what} {dims}) needs {want}"
    return None


def first_idx_problem(folder: Path) -> str | None:
    """The first idx file under folder (`*-ubyte`, as torchvision's MNIST family stores them) with a problem."""
    for path in sorted(folder.rglob("*-ubyte")) if folder.is_dir() else []:
        if problem := idx_problem(path):
            return problem
    return None


# ---------------------------------------------------------------------------------------------------------------------
# A folder of a user's images: the one place that says how its splits and files are found
# ---------------------------------------------------------------------------------------------------------------------

# Split folder names: timm's (_TRAIN_SYNONYM, _EVAL_SYNONYM) and Hugging Face's (train / validation / test).
SPLIT_NAMES = {
    "train": ("train", "training"),
    "val": ("val", "valid", "validation", "eval", "evaluation", "dev"),
    "test": ("test", "testing"),
}
TRAIN_DIRS, VAL_DIRS = SPLIT_NAMES["train"], SPLIT_NAMES["val"]


def class_files(folder: Path, to_idx: dict[str, int]) -> list[tuple[str, int]]:
    """(path, class index) of every image under folder/<class>/, subfolders of a class included, sorted per class
    (torchvision's ImageFolder listing, with its extensions)."""
    return DatasetFolder.make_dataset(str(folder), to_idx, extensions=IMG_EXTENSIONS, allow_empty=True)
