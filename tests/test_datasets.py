"""torchvision datasets by name, offline, from tiny files the tests write in each dataset's real on-disk format."""

import struct

import numpy as np
import pytest
import torch
from torchvision import datasets

from vit.data import DataError
from vit.datasets import TorchvisionDataModule
from vit.device_data import DeviceBatches


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


def test_mnist_by_name_trains_as_one_channel_with_its_own_statistics(tmp_path):
    images, labels = write_mnist(tmp_path)
    dm = TorchvisionDataModule("torch/mnist", root=str(tmp_path), download=False, batch_size=8)
    assert dm.in_chans == 1 and dm.img_size == 28 and dm.num_classes == 10
    x, y = dm.memory["train"]
    assert torch.equal(x[:, 0], torch.from_numpy(images)) and torch.equal(y, torch.from_numpy(labels).long())
    assert dm.mean == (round(images.mean() / 255, 4),)  # measured on the training split, not ImageNet's
    assert (tmp_path / "mnist_stats.json").is_file()  # cached
    batch = next(iter(dm._device_batches("train")))
    assert batch[0].shape == (8, 1, 28, 28)
    rgb = TorchvisionDataModule("torch/mnist", root=str(tmp_path), download=False, to_rgb=True, img_size=32)
    assert rgb.in_chans == 3 and rgb.memory["val"][0].shape == (10, 3, 32, 32)


def test_kmnist_is_the_same_format_under_its_own_folder(tmp_path):
    write_mnist(tmp_path, "KMNIST")
    dm = TorchvisionDataModule("torch/kmnist", root=str(tmp_path), download=False)
    assert dm.memory["train"][0].shape == (24, 1, 28, 28)


def test_svhn_from_its_mat_files(tmp_path, monkeypatch):
    from scipy.io import savemat

    monkeypatch.setattr(datasets.SVHN, "_check_integrity", lambda self: True)  # our tiny files, not the real md5s
    rng = np.random.default_rng(0)
    for split, n in (("train", 12), ("test", 5)):
        X = rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)  # SVHN's layout: H, W, C, N
        y = (np.arange(n) % 10 + 1)[:, None].astype(np.uint8)  # labels 1..10, 10 meaning the digit 0
        savemat(tmp_path / f"{split}_32x32.mat", {"X": X, "y": y})
    dm = TorchvisionDataModule("torch/svhn", root=str(tmp_path), download=False)
    x, y = dm.memory["train"]
    assert x.shape == (12, 3, 32, 32) and dm.in_chans == 3
    assert torch.equal(x[3], torch.from_numpy(_svhn_image(tmp_path, 3)))
    assert y.tolist()[:10] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 0]


def _svhn_image(root, i: int) -> np.ndarray:
    from scipy.io import loadmat

    return np.transpose(loadmat(root / "train_32x32.mat")["X"], (3, 2, 0, 1))[i]


def test_stl10_from_its_binaries(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.STL10, "_check_integrity", lambda self: True)
    folder = tmp_path / "stl10_binary"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 6), ("test", 4)):
        X = rng.integers(0, 256, (n, 3, 96, 96), dtype=np.uint8)
        # STL10 stores each image column-major: torchvision transposes the last two axes when reading
        np.transpose(X, (0, 1, 3, 2)).tofile(folder / f"{split}_X.bin")
        (np.arange(n) % 10 + 1).astype(np.uint8).tofile(folder / f"{split}_y.bin")
        if split == "train":
            first = X[0]
    names = "airplane bird car cat deer dog horse monkey ship truck".split()
    (folder / "class_names.txt").write_text("\n".join(names) + "\n")
    dm = TorchvisionDataModule("torch/stl10", root=str(tmp_path), download=False, img_size=48)
    assert dm.class_names == names and dm.num_classes == 10
    assert dm.memory["train"][0].shape == (6, 3, 48, 48)
    full = TorchvisionDataModule("torch/stl10", root=str(tmp_path), download=False)
    assert torch.equal(full.memory["train"][0][0], torch.from_numpy(first))
    assert full.memory["train"][1].tolist() == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    "name, expected",
    [
        ("torch/mnist", "put train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, "),
        ("torch/svhn", "put train_32x32.mat and test_32x32.mat"),
        ("torch/stl10", "put stl10_binary.tar.gz"),
    ],
)
def test_offline_without_files_is_one_line_saying_what_goes_where(tmp_path, name, expected):
    with pytest.raises(DataError) as e:
        TorchvisionDataModule(name, root=str(tmp_path), download=False)
    msg = str(e.value)
    assert "\n" not in msg and expected in msg and str(tmp_path) in msg, msg


def test_bad_names_are_one_line():
    with pytest.raises(ValueError, match="named torch/<name>"):
        TorchvisionDataModule("mnist")
    with pytest.raises(ValueError, match="torchvision.datasets has no Nope"):
        TorchvisionDataModule("torch/Nope")


def test_the_mnist_config_trains_by_name(tmp_path, monkeypatch):
    """configs/mnist.yaml uses a torchvision dataset by name: one short fit from tiny files."""
    import train

    write_mnist(tmp_path / "data", n_train=64, n_test=16)
    monkeypatch.chdir(tmp_path)
    cli = train.main(
        [
            "--config",
            "configs/mnist.yaml",
            "--data.init_args.download=false",
            "--trainer.max_epochs=1",
            "--trainer.enable_progress_bar=false",
            "--model.arch.embed_dim=16",
            "--model.arch.depth=1",
        ]
    )
    assert cli.model.model.patch_embed.proj.in_channels == 1  # in_chans linked from the data
    assert isinstance(cli.datamodule.train_dataloader(), DeviceBatches)
