"""Tiny datasets written in each dataset's exact on-disk format, for the tests that read them as a user's files."""

import hashlib
import pickle
import struct
import tarfile

import numpy as np
from torchvision import datasets

from vit.data.cifar_files import CIFAR10_CLASSES, CIFAR100_CLASSES


def _md5(path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def write_cifar(root, dataset="cifar10", n_train=20, n_test=4, seed=0, bytes_keys=False):
    """CIFAR-10 (five training batches, a test batch, batches.meta) or CIFAR-100 (train, test, meta) as torchvision
    reads them: pickles with str keys, as the original Python 2 files read with encoding='latin1', also packed as the
    .tar.gz one downloads. `bytes_keys`: keys as Python 3 writes bytes (a foreign file). Returns {file name: md5} and
    {batch name: (data (n, 3072) uint8, labels)}."""
    cls = datasets.CIFAR10 if dataset == "cifar10" else datasets.CIFAR100
    rng = np.random.default_rng(seed)
    folder = root / cls.base_folder
    folder.mkdir(parents=True)
    key = (lambda k: k.encode()) if bytes_keys else (lambda k: k)
    train_names = [n for n, _ in cls.train_list]
    sizes = {n: n_train // len(train_names) for n in train_names} | {n: n_test for n, _ in cls.test_list}
    labels_key = "labels" if dataset == "cifar10" else "fine_labels"
    num_classes = 10 if dataset == "cifar10" else 100
    data = {}
    for name, n in sizes.items():
        x = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)  # rows of R(1024) G(1024) B(1024)
        y = rng.integers(0, num_classes, size=n).tolist()
        data[name] = (x, y)
        record = {"batch_label": name, labels_key: y, "data": x, "filenames": [f"{name}_{i}.png" for i in range(n)]}
        if dataset == "cifar100":
            record["coarse_labels"] = [v // 5 for v in y]
        with open(folder / name, "wb") as f:
            pickle.dump({key(k): v for k, v in record.items()}, f, protocol=2)
    meta = (
        {"label_names": CIFAR10_CLASSES, "num_cases_per_batch": n_train, "num_vis": 3072}
        if dataset == "cifar10"
        else {"fine_label_names": CIFAR100_CLASSES, "coarse_label_names": [f"c{i}" for i in range(20)]}
    )
    with open(folder / cls.meta["filename"], "wb") as f:
        pickle.dump({key(k): v for k, v in meta.items()}, f, protocol=2)
    with tarfile.open(root / cls.filename, "w:gz") as tar:
        tar.add(folder, arcname=cls.base_folder)
    md5 = {p.name: _md5(p) for p in folder.iterdir()}
    md5[cls.filename] = _md5(root / cls.filename)
    return md5, data


def trust_cifar_checksums(monkeypatch, dataset: str, md5: dict) -> None:
    """torchvision checks each file against the real CIFAR's md5: point those checks at our tiny files."""
    cls = datasets.CIFAR10 if dataset == "cifar10" else datasets.CIFAR100
    monkeypatch.setattr(cls, "train_list", [[n, md5[n]] for n, _ in cls.train_list])
    monkeypatch.setattr(cls, "test_list", [[n, md5[n]] for n, _ in cls.test_list])
    monkeypatch.setattr(cls, "meta", {**cls.meta, "md5": md5[cls.meta["filename"]]})
    monkeypatch.setattr(cls, "tgz_md5", md5[cls.filename])


def write_mnist(root, cls_name="MNIST", n_train=24, n_test=10, seed=0) -> tuple[np.ndarray, np.ndarray]:
    """MNIST's idx-ubyte files (uncompressed) in root/<cls>/raw/, as torchvision reads them."""
    rng = np.random.default_rng(seed)
    raw = root / cls_name / "raw"
    raw.mkdir(parents=True)
    out = []
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, n) + labels.tobytes())
        out.append((images, labels))
    return out[0]
