"""torchvision datasets by name, offline, from tiny files the tests write in each dataset's real on-disk format."""

import struct

import numpy as np
import pytest
import torch
from formats import write_mnist
from torchvision import datasets

from vit.data.device import DeviceBatches
from vit.data.torchvision_data import TorchvisionDataModule
from vit.data.transforms import DataError


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
    # 28 px in memory, upsampled to 32 after augmentation: padding and crops act on the digits' own pixels
    assert rgb.in_chans == 3 and rgb.img_size == 32 and rgb.memory["val"][0].shape == (10, 3, 28, 28)
    assert next(iter(rgb._device_batches("train")))[0].shape[1:] == (3, 32, 32)


def test_pretrained_weights_normalisation_replaces_the_measured_one_and_fits_grey_images(tmp_path):
    write_mnist(tmp_path)
    rgb_stats = dict(mean=(0.4, 0.5, 0.6), std=(0.3,) * 3)
    grey = TorchvisionDataModule("torch/mnist", root=str(tmp_path), download=False, **rgb_stats)
    assert grey.in_chans == 1 and grey.mean == pytest.approx((0.5,)) and grey.std == pytest.approx((0.3,))
    assert not (tmp_path / "mnist_stats.json").exists()  # given, so not measured
    rgb = TorchvisionDataModule("torch/mnist", root=str(tmp_path), download=False, to_rgb=True, mean=(0.5,), std=(0.5,))
    assert rgb.mean == (0.5, 0.5, 0.5) and rgb.std == (0.5, 0.5, 0.5)
    with pytest.raises(ValueError, match=r"^mean=\[0.1, 0.2\]: 2 values for 1-channel images$"):
        TorchvisionDataModule("torch/mnist", root=str(tmp_path), download=False, mean=(0.1, 0.2), std=(0.3, 0.3))


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


def test_every_name_in_timms_table_is_accepted():
    """timm.data.dataset_factory's torch/<name> names (its basic table and each `name == '...'` branch) resolve to a
    torchvision class here; the older spellings stay as aliases."""
    import inspect
    import re

    from timm.data import dataset_factory

    from vit.data.torchvision_data import resolve

    branches = set(re.findall(r"name == '(\w+)'", inspect.getsource(dataset_factory.create_dataset)))
    names = set(dataset_factory._TORCH_BASIC_DS) | branches
    assert {"fashion_mnist", "qmnist", "inaturalist", "places365", "imagenet", "image_folder"} <= names  # parsed
    for name in names:
        _, cls, _ = resolve(f"torch/{name}")
        assert issubclass(cls, datasets.VisionDataset), name
    assert resolve("torch/fashion_mnist")[1] is resolve("torch/fashionmnist")[1] is datasets.FashionMNIST
    assert resolve("torch/folder")[1] is datasets.ImageFolder and resolve("torch/inat")[1] is datasets.INaturalist


def test_qmnist_takes_the_class_from_its_label_records(tmp_path):
    """QMNIST's labels are (N, 8) int32 records whose first column is the class."""
    raw = tmp_path / "QMNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for what, n in (("train", 20), ("test", 6)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        records = np.zeros((n, 8), dtype=">i4")
        records[:, 0], records[:, 5] = np.arange(n) % 10, 1234  # class; writer id
        (raw / f"qmnist-{what}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
        (raw / f"qmnist-{what}-labels-idx2-int").write_bytes(struct.pack(">III", 0x0C02, n, 8) + records.tobytes())
    dm = TorchvisionDataModule("torch/qmnist", root=str(tmp_path), download=False)
    assert dm.num_classes == 10 and dm.memory["train"][1].tolist() == [i % 10 for i in range(20)]
    assert dm.memory["val"][0].shape == (6, 1, 28, 28)


def test_file_backed_sets_image_folder_and_imagenet(tmp_path):
    """timm's torch/image_folder (root/train, root/val) and torch/imagenet (meta.bin + the same folders) are read
    from their file lists and decoded once at img_size."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", 3), ("val", 2)):
        for wnid in ("n01", "n02"):
            (tmp_path / split / wnid).mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(tmp_path / split / wnid / f"{wnid}_{i}.png")
    folder = TorchvisionDataModule("torch/image_folder", root=str(tmp_path), img_size=16)
    assert folder.class_names == ["n01", "n02"] and folder.memory["train"][0].shape == (6, 3, 16, 16)
    assert folder.memory["val"][1].tolist() == [0, 0, 1, 1]
    meta = {"n01": ("tench", "Tinca tinca"), "n02": ("goldfish",)}
    torch.save((meta, ["n01", "n02"]), tmp_path / "meta.bin")
    net = TorchvisionDataModule("torch/imagenet", root=str(tmp_path), img_size=16)
    assert net.class_names == ["tench", "goldfish"] and net.memory["val"][0].shape == (4, 3, 16, 16)


def test_fashion_mnist_by_timms_name_trains_with_the_mnist_config(tmp_path, monkeypatch):
    """configs/mnist.yaml with timm's name for Fashion-MNIST: one short fit from its on-disk files."""
    import train

    write_mnist(tmp_path / "data", "FashionMNIST", n_train=64, n_test=16)
    monkeypatch.chdir(tmp_path)
    cli = train.main(
        [
            "--config",
            "configs/mnist.yaml",
            "--data.init_args.dataset=torch/fashion_mnist",
            "--data.init_args.download=false",
            "--trainer.max_epochs=1",
            "--trainer.enable_progress_bar=false",
            "--model.arch.embed_dim=16",
            "--model.arch.depth=1",
        ]
    )
    assert cli.model.model.patch_embed.proj.in_channels == 1  # in_chans linked from the data
    assert isinstance(cli.datamodule.train_dataloader(), DeviceBatches)
