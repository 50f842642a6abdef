import numpy as np
import pytest
import torch
from formats import trust_cifar_checksums, write_cifar
from PIL import Image

from vit.data.cifar import CIFAR10_CLASSES, CIFARDataModule
from vit.data.device import DeviceBatches
from vit.data.digits import DigitsDataModule
from vit.data.folder import ImageFolderDataModule
from vit.data.images import load_image
from vit.data.transforms import DataError


@pytest.fixture
def tiny_cifar(tmp_path, monkeypatch):
    md5, data = write_cifar(tmp_path)
    trust_cifar_checksums(monkeypatch, "cifar10", md5)
    return tmp_path, data


def test_cifar10_loads_torchvision_on_disk_format(tiny_cifar):
    root, data = tiny_cifar
    dm = CIFARDataModule("cifar10", root=str(root), download=False, batch_size=4, num_workers=0)
    assert (dm.num_classes, dm.class_names, dm.img_size) == (10, CIFAR10_CLASSES, 32)
    dm.prepare_data()
    dm.setup("fit")
    assert len(dm.train_set) == 20 and len(dm.val_set) == 4
    # Validation is untouched by augmentation: the first test image comes back as stored, normalised.
    x, y = dm.val_set[0]
    raw = torch.from_numpy(data["test_batch"][0][0]).reshape(3, 32, 32).float() / 255
    mean, std = torch.tensor(dm.mean)[:, None, None], torch.tensor(dm.std)[:, None, None]
    torch.testing.assert_close(x, (raw - mean) / std)
    assert y == data["test_batch"][1][0]
    xb, yb = next(iter(dm.train_dataloader()))
    assert xb.shape == (4, 3, 32, 32) and xb.dtype == torch.float32 and yb.shape == (4,)


def test_cifar_takes_pretrained_weights_normalisation(tiny_cifar):
    root, data = tiny_cifar
    dm = CIFARDataModule("cifar10", root=str(root), download=False, num_workers=0, mean=(0.5,) * 3, std=(0.5,) * 3)
    dm.prepare_data()
    dm.setup("fit")
    x, _ = dm.val_set[0]
    raw = torch.from_numpy(data["test_batch"][0][0]).reshape(3, 32, 32).float() / 255
    torch.testing.assert_close(x, (raw - 0.5) / 0.5)


def test_cifar10_extracts_an_archive_put_in_root_without_network(tiny_cifar):
    root, _ = tiny_cifar
    import shutil

    shutil.rmtree(root / "cifar-10-batches-py")  # only the .tar.gz, as a person would download it by hand
    dm = CIFARDataModule("cifar10", root=str(root), download=True, batch_size=4, num_workers=0)
    dm.prepare_data()
    dm.setup("fit")
    assert len(dm.train_set) == 20


def test_missing_cifar_says_where_to_put_the_archive(tmp_path):
    """Found missing when the data module is built (before any Trainer), in one line."""
    with pytest.raises(DataError, match=r"put cifar-10-python\.tar\.gz .* in .*nothing/") as e:
        CIFARDataModule("cifar10", root=str(tmp_path / "nothing"), download=False, num_workers=0)
    assert "\n" not in str(e.value)


def test_cifar100_names(tmp_path, monkeypatch):
    md5, _ = write_cifar(tmp_path, "cifar100", n_train=10, n_test=2)
    trust_cifar_checksums(monkeypatch, "cifar100", md5)
    dm = CIFARDataModule("cifar100", root=str(tmp_path), download=False, num_workers=0)
    assert dm.num_classes == 100 == len(set(dm.class_names))
    assert dm.class_names[:3] == ["apple", "aquarium_fish", "baby"] and dm.class_names[-1] == "worm"


def test_cifar_is_torch_cifar10_with_cifars_defaults_and_upsamples_after_augmentation(tiny_cifar):
    """One home for CIFAR: vit.data.CIFARDataModule is `torch/cifar10` of the torchvision DataModule with CIFAR's
    defaults; both keep the 32 px images in memory at any img_size and upsample each batch after augmentation."""
    from vit.data.torchvision_data import TorchvisionDataModule

    root, data = tiny_cifar
    cifar = CIFARDataModule("cifar10", root=str(root), download=False, batch_size=4, num_workers=0, img_size=64)
    same = TorchvisionDataModule("torch/cifar10", root=str(root), download=False, batch_size=4, img_size=64,
                                 crop_padding=4, hflip=True)  # fmt: skip
    assert isinstance(cifar, TorchvisionDataModule) and (cifar.img_size, cifar.class_names) == (64, CIFAR10_CLASSES)
    assert cifar.memory["train"][0].shape == (20, 3, 32, 32) == same.memory["train"][0].shape  # 32 px in memory
    assert cifar.mean == same.mean and cifar.augmentation.crop_padding == same.augmentation.crop_padding == 4
    assert cifar.augmentation.hflip and same.augmentation.hflip
    for split in ("train", "val"):
        torch.manual_seed(0)
        a = next(iter(cifar._device_batches(split)))
        torch.manual_seed(0)
        b = next(iter(same._device_batches(split)))
        assert a[0].shape == (4, 3, 64, 64)
        torch.testing.assert_close(a, b)
    # validation: the stored image, normalised, then upsampled (nothing else)
    raw = torch.from_numpy(data["test_batch"][0][:1]).reshape(1, 3, 32, 32).float() / 255
    mean, std = torch.tensor(cifar.mean)[:, None, None], torch.tensor(cifar.std)[:, None, None]
    want = torch.nn.functional.interpolate((raw - mean) / std, size=(64, 64), mode="bilinear", align_corners=False)
    torch.testing.assert_close(next(iter(cifar._device_batches("val")))[0][:1], want)


def test_cifar_in_memory_false_streams_through_torchvision_transforms(tiny_cifar):
    root, _ = tiny_cifar
    dm = CIFARDataModule("cifar10", root=str(root), download=False, batch_size=4, num_workers=0, in_memory=False)
    loader = dm.train_dataloader()
    assert isinstance(loader, torch.utils.data.DataLoader)
    xb, yb = next(iter(loader))
    assert xb.shape == (4, 3, 32, 32) and xb.dtype == torch.float32 and yb.shape == (4,)


def test_another_local_rank_waits_for_local_rank_zeros_download(tmp_path, monkeypatch):
    """Under torchrun every rank builds the DataModule at once: rank 0 downloads, the others wait for its files
    instead of downloading into the same folder."""
    import threading

    from torchvision import datasets

    import vit.data.torchvision_data as tv

    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(tv, "DOWNLOAD_WAIT_S", 60.0)
    monkeypatch.setattr(tv, "DOWNLOAD_POLL_S", 0.05)
    fetched = []
    monkeypatch.setattr(datasets.CIFAR10, "download", lambda self: fetched.append(self.root))
    written = {}

    def rank_zero():  # its download lands a moment later; until the checksums are set, a partial file fails them
        written["md5"], _ = write_cifar(tmp_path, n_train=10, n_test=2)
        trust_cifar_checksums(monkeypatch, "cifar10", written["md5"])

    timer = threading.Timer(0.3, rank_zero)
    timer.start()
    try:
        dm = CIFARDataModule("cifar10", root=str(tmp_path), download=True, num_workers=0)
    finally:
        timer.join()
    assert len(dm.memory["train"][0]) == 10 and fetched == []  # read rank 0's files, fetched nothing
    monkeypatch.setattr(tv, "DOWNLOAD_WAIT_S", 0.0)  # and waits no longer than that
    with pytest.raises(DataError, match="not found"):
        CIFARDataModule("cifar10", root=str(tmp_path / "never"), download=True, num_workers=0)


def _write_images(folder, n, mode, size, seed):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        arr = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
        img = Image.fromarray(arr)
        if mode == "P":
            img = img.convert("P")
        elif mode == "I;16":
            img = Image.fromarray(arr[..., 0].astype(np.uint16) * 257)
        elif mode != "RGB":
            img = img.convert(mode)
        img.save(folder / f"{mode.replace(';', '_')}-{seed}-{i}.{'jpg' if mode in ('RGB', 'CMYK') else 'png'}")


def test_image_folder_with_train_and_val(tmp_path):
    for split, n in (("train", 6), ("val", 2)):
        _write_images(tmp_path / split / "cat", n, "RGB", (50, 40), 0)
        _write_images(tmp_path / split / "dog", n, "RGBA", (20, 30), 1)
        _write_images(tmp_path / split / "eel", n, "L", (64, 64), 2)
    _write_images(tmp_path / "train" / "eel", 2, "P", (33, 33), 3)
    _write_images(tmp_path / "train" / "eel", 2, "I;16", (16, 24), 4)
    dm = ImageFolderDataModule(str(tmp_path), img_size=24, batch_size=4, num_workers=0)
    assert dm.class_names == ["cat", "dog", "eel"] and dm.num_classes == 3
    dm.setup("fit")
    assert len(dm.train_set) == 22 and len(dm.val_set) == 6
    for x, _ in dm.train_dataloader():
        assert x.shape == (4, 3, 24, 24)
    ys = sorted(y for _, y in dm.val_set)
    assert ys == [0, 0, 1, 1, 2, 2]


def test_image_folder_split_by_fraction_and_seed(tmp_path):
    for c in ("a", "b"):
        _write_images(tmp_path / c, 10, "RGB", (32, 32), ord(c))
    dm = ImageFolderDataModule(str(tmp_path), val_fraction=0.25, split_seed=3, num_workers=0)
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set)) == (15, 5)
    train, val = ({p for p, _ in dm.samples[s]} for s in ("train", "val"))
    assert train.isdisjoint(val) and len(train | val) == 20
    again = ImageFolderDataModule(str(tmp_path), val_fraction=0.25, split_seed=3, num_workers=0)
    assert again.samples["val"] == dm.samples["val"]
    # The val set uses the evaluation transform: deterministic, unlike the training one.
    torch.testing.assert_close(dm.val_set[0][0], dm.val_set[0][0])


def test_image_folder_takes_the_in_memory_path_within_the_budget_and_streams_over_it(tmp_path, caplog):
    """Both paths give the same validation tensors (the evaluation geometry is decoded once, or per item); the log
    says which path was taken and why."""
    for c, mode in (("a", "RGB"), ("b", "L")):
        _write_images(tmp_path / c, 8, mode, (40, 30), ord(c))
    with caplog.at_level("INFO"):
        mem = ImageFolderDataModule(str(tmp_path), img_size=16, num_workers=0)
        tiny = ImageFolderDataModule(str(tmp_path), img_size=16, num_workers=0, max_memory_gb=1e-6)
    assert mem.in_memory and not tiny.in_memory
    messages = [r.getMessage() for r in caplog.records]
    assert any("in-memory path" in m and "within max_memory_gb" in m for m in messages), messages
    assert any("streaming path" in m and "over max_memory_gb=0.00" in m for m in messages), messages
    assert mem.memory["train"][0].shape == (13, 3, 16, 16) and mem.memory["train"][0].dtype == torch.uint8
    assert mem.mean == tiny.mean or mem.mean != tiny.mean  # both measured (tiny: on a sample of the same images)
    mem.setup("fit"), tiny.setup("fit")
    a = torch.stack([mem.val_set[i][0] for i in range(len(mem.val_set))])
    b = torch.stack([tiny.val_set[i][0] for i in range(len(tiny.val_set))])
    torch.testing.assert_close(a, b)
    assert isinstance(mem.train_dataloader(), DeviceBatches)
    x, _ = next(iter(tiny.train_dataloader()))
    assert x.shape == (4, 3, 16, 16) or x.shape[1:] == (3, 16, 16)


def test_image_folder_mean_std_measured_on_its_training_images(tmp_path):
    for c in ("a", "b"):
        _write_images(tmp_path / c, 6, "L", (20, 20), ord(c))
    dm = ImageFolderDataModule(str(tmp_path), img_size=16, num_workers=0)
    x = dm.memory["train"][0].float() / 255
    assert dm.mean == tuple(float(f"{v:.5g}") for v in x.mean(dim=(0, 2, 3)).tolist())
    assert dm.in_chans == 1 and len(dm.mean) == 1  # grayscale files: one channel, its own statistics, not ImageNet's
    given = ImageFolderDataModule(str(tmp_path), img_size=16, num_workers=0, mean=(0.5, 0.5, 0.5), std=(0.2, 0.2, 0.2))
    assert given.mean == pytest.approx((0.5,)) and given.std == pytest.approx((0.2,))  # RGB statistics: their average
    rgb = ImageFolderDataModule(str(tmp_path), img_size=16, num_workers=0, in_chans=3)
    assert rgb.memory["train"][0].shape[1] == 3 and rgb.mean[0] == rgb.mean[1] == rgb.mean[2]


def test_a_grey_folder_trains_one_channel_in_memory_and_streaming_and_a_colour_image_keeps_three(tmp_path):
    """Grey however stored (L, 16-bit, RGB files with equal channels): 1 channel on both paths, the same tensors;
    one colour image among them: 3."""
    from vit.data.sources import folder_source
    from vit.planning.fingerprint import fingerprint

    for c, mode in (("a", "L"), ("b", "I;16")):
        _write_images(tmp_path / c, 6, mode, (20, 20), ord(c))
    Image.open(next((tmp_path / "a").iterdir())).convert("RGB").save(tmp_path / "a" / "rgb_copy.png")
    mem = ImageFolderDataModule(str(tmp_path), img_size=16, num_workers=0)
    streamed = ImageFolderDataModule(str(tmp_path), img_size=16, num_workers=0, in_memory=False)
    assert mem.in_chans == streamed.in_chans == 1 and mem.memory["train"][0].shape[1:] == (1, 16, 16)
    mem.setup("fit"), streamed.setup("fit")
    a = torch.stack([mem.val_set[i][0] for i in range(len(mem.val_set))])
    b = torch.stack([streamed.val_set[i][0] for i in range(len(streamed.val_set))])
    assert a.shape[1] == 1
    torch.testing.assert_close(a, b)
    assert fingerprint(folder_source(tmp_path)).in_chans == 1  # the planner times a 1-channel model
    _write_images(tmp_path / "a", 1, "RGB", (20, 20), 99)
    assert ImageFolderDataModule(str(tmp_path), img_size=16, num_workers=0).in_chans == 3
    assert fingerprint(folder_source(tmp_path)).in_chans == 3


def test_image_folder_errors_name_the_path(tmp_path):
    with pytest.raises(DataError, match="is not a folder"):
        ImageFolderDataModule(str(tmp_path / "missing"))
    (tmp_path / "train" / "a").mkdir(parents=True)
    (tmp_path / "val" / "zebra").mkdir(parents=True)
    with pytest.raises(DataError, match=r"classes \['zebra'\] are not in"):
        ImageFolderDataModule(str(tmp_path))


@pytest.mark.parametrize("mode", ["L", "RGBA", "P", "CMYK", "LA"])
def test_load_image_converts_every_8_bit_mode_to_rgb(tmp_path, mode):
    _write_images(tmp_path, 1, mode, (9, 7), 0)
    path = next(tmp_path.iterdir())
    img = load_image(path)
    assert img.mode == "RGB" and img.size == (9, 7)


def test_load_image_keeps_16_bits_as_floats_over_the_full_range(tmp_path):
    values = [0, 1, 4095, 32896, 65535]  # 1 and 4095: lost to 8 bits (0 and 16 there)
    Image.fromarray(np.array([values], dtype=np.uint16)).save(tmp_path / "x.png")
    x = load_image(tmp_path / "x.png")
    assert x.dtype == torch.float32 and x.shape == (3, 1, 5)  # grey repeated for a 3-channel model
    assert torch.equal(x[0, 0], torch.tensor(values, dtype=torch.float32) / 65535)
    assert load_image(tmp_path / "x.png", in_chans=1).shape == (1, 1, 5)


def test_digits_split_and_ranges():
    dm = DigitsDataModule()
    assert (len(dm.train_set), len(dm.val_set)) == (1437, 360)
    assert dm.train_set.images.dtype == torch.uint8 and dm.train_set.images.shape[1:] == (3, 32, 32)
    assert dm.train_set.images.max() == 255 and dm.train_set.images.min() == 0
    assert sorted(set(dm.val_set.targets.tolist())) == list(range(10))
    # fixed split: same seed, same images; another seed, another split
    again, other = DigitsDataModule(), DigitsDataModule(split_seed=1)
    assert torch.equal(again.val_set.images, dm.val_set.images)
    assert not torch.equal(other.val_set.images, dm.val_set.images)
    x = torch.stack([dm.val_set[i][0] for i in range(len(dm.val_set))])
    assert x.dtype == torch.float32 and abs(x.mean().item()) < 0.1 and 0.8 < x.std().item() < 1.2


def test_digits_augmentation_crops_but_never_flips():
    dm = DigitsDataModule()
    raw = dm.train_set.images[0].float() / 255
    mean, std = torch.tensor(dm.mean)[:, None, None], torch.tensor(dm.std)[:, None, None]
    views = [dm.train_set[0][0] * std + mean for _ in range(30)]
    assert any(not torch.allclose(v, raw, atol=1e-5) for v in views)  # crops move the digit
    flipped = raw.flip(-1)
    assert not any(torch.allclose(v, flipped, atol=1e-5) for v in views)


def _bad_files(folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "text.png").write_text("not an image")
    (folder / "zero.jpg").write_bytes(b"")
    good = folder / "good.png"
    Image.fromarray(np.zeros((20, 20, 3), dtype=np.uint8)).save(good)
    (folder / "truncated.png").write_bytes(good.read_bytes()[:40])


def test_image_folder_skips_and_lists_bad_files(tmp_path, caplog):
    for c in ("a", "b"):
        _write_images(tmp_path / c, 5, "RGB", (24, 24), ord(c))
    _bad_files(tmp_path / "a")
    with caplog.at_level("WARNING", logger="vit.data.folder"):
        dm = ImageFolderDataModule(str(tmp_path), num_workers=0)
        dm.setup("fit")
    assert len(dm.train_set) + len(dm.val_set) == 11  # 5 + 5 + the good one
    skipped = [r.message for r in caplog.records if r.message.startswith("skipping")]
    assert len(skipped) == 3 and any("zero.jpg: not an image" in m for m in skipped)
    assert any("truncated.png" in m for m in skipped)


def test_image_folder_strict_stops_before_training(tmp_path):
    for c in ("a", "b"):
        _write_images(tmp_path / c, 3, "RGB", (24, 24), ord(c))
    _bad_files(tmp_path / "b")
    with pytest.raises(DataError, match=r"3 unreadable image\(s\) and strict=true: .*text.png: not an image"):
        ImageFolderDataModule(str(tmp_path), num_workers=0, strict=True)


def test_an_empty_class_folder_is_an_error(tmp_path):
    _write_images(tmp_path / "train" / "a", 3, "RGB", (24, 24), 0)
    (tmp_path / "train" / "empty").mkdir()
    (tmp_path / "train" / "empty" / "broken.png").write_text("x")
    _write_images(tmp_path / "val" / "a", 2, "RGB", (24, 24), 1)
    with pytest.raises(DataError, match=r"class\(es\) \['empty'\] hold no usable training image"):
        ImageFolderDataModule(str(tmp_path), num_workers=0)


@pytest.mark.parametrize("in_memory", [True, False])
def test_eval_batch_size_sets_validation_batches_only(in_memory):
    dm = DigitsDataModule(batch_size=32, eval_batch_size=100, in_memory=in_memory)
    dm.setup("fit")
    assert {len(x) for x, _ in dm.train_dataloader()} == {32}
    assert [len(x) for x, _ in dm.val_dataloader()] == [100, 100, 100, 60]
    assert [len(x) for x, _ in DigitsDataModule(batch_size=50).val_dataloader()][:1] == [50]  # default: batch_size
    with pytest.raises(ValueError, match="eval_batch_size=0"):
        DigitsDataModule(eval_batch_size=0)


def test_mean_std_in_chunks_equal_the_whole_set_and_the_stack_releases_the_list():
    from vit.data.base import channel_mean_std
    from vit.data.folder import stack_releasing

    x = torch.randint(0, 256, (50, 3, 6, 5), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    mean, std = channel_mean_std(x, chunk=7)
    ref = x.float() / 255
    torch.testing.assert_close(mean, ref.mean(dim=(0, 2, 3)))
    torch.testing.assert_close(std, ref.std(dim=(0, 2, 3)))
    images = list(x)
    stacked = stack_releasing(images)
    assert torch.equal(stacked, x) and all(img is None for img in images)  # nothing kept twice


@pytest.mark.parametrize("train, val", [("train", "val"), ("training", "valid"), ("train", "validation")])
def test_every_reader_of_a_folder_finds_the_same_splits_and_files(tmp_path, train, val):
    """One listing (vit/data/listing.py) for the DataModule, the planner's source and the streaming optimizer: timm's
    split names, and images inside a subfolder of a class counted by all of them."""
    from vit.data.files import class_files
    from vit.data.listing import list_folder
    from vit.data.sources import folder_source

    for split, n in ((train, 6), (val, 3)):
        for c in ("a", "b"):
            _write_images(tmp_path / split / c, n, "RGB", (12, 12), ord(c))
    _write_images(tmp_path / train / "a" / "more", 2, "RGB", (12, 12), 7)  # a subfolder of class a
    listing = list_folder(tmp_path)
    assert sorted(listing.splits) == ["train", "val"] and listing.found == f"{train}/ + {val}/"
    assert len(class_files(tmp_path / train, {"a": 0, "b": 1})) == 14
    dm = ImageFolderDataModule(str(tmp_path), num_workers=0, img_size=12)
    dm.setup("fit")
    assert len(dm.samples["train"]) == 14 and len(dm.samples["val"]) == 6
    src = folder_source(tmp_path)
    assert (src.n_train, src.n_val) == (14, 6)
    # a train folder alone: its classes, validation split off by the toolkit (not one class named "train")
    alone = list_folder(tmp_path / train)
    assert sorted(alone.splits) == ["train"] and alone.class_names == ["a", "b"]
