"""Every data source planned alike (vit/data/sources.py): one fingerprint from a folder, CIFAR's files, a torchvision
dataset and litdata chunks, on tiny files written in each one's real on-disk format; and planned runs of CIFAR and
torch/mnist from the command line, as a user types them."""

import dataclasses
import math
import time

import numpy as np
import pytest
import yaml
from fake_speeds import CPU2, speeds_by_tokens
from formats import trust_cifar_checksums, write_cifar, write_mnist
from PIL import Image

import train
from vit.data.sources import cifar_source, folder_source, source_for, stream_source, torchvision_source
from vit.planning.fingerprint import fingerprint
from vit.planning.plan import make_plan

MNIST_CLASSES = ["0 - zero", "1 - one", "2 - two", "3 - three", "4 - four", "5 - five", "6 - six", "7 - seven",
                 "8 - eight", "9 - nine"]  # fmt: skip


def mnist_and_its_folder(tmp_path, n_train=40, n_test=10):
    """MNIST's files and the same images as root/train/<class>/*.png and root/val/<class>/*.png."""
    train_x, train_y = write_mnist(tmp_path / "data", n_train=n_train, n_test=n_test)
    raw = tmp_path / "data" / "MNIST" / "raw"
    test_x = np.frombuffer((raw / "t10k-images-idx3-ubyte").read_bytes()[16:], np.uint8).reshape(-1, 28, 28)
    test_y = np.frombuffer((raw / "t10k-labels-idx1-ubyte").read_bytes()[8:], np.uint8)
    for split, xs, ys in (("train", train_x, train_y), ("val", test_x, test_y)):
        for i, (x, y) in enumerate(zip(xs, ys)):
            folder = tmp_path / "folder" / split / MNIST_CLASSES[y]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(x).save(folder / f"{i:04d}.png")
    return tmp_path / "data", tmp_path / "folder"


def same_facts(a, b) -> dict:
    """The fingerprint fields that describe the images (not how they are named, held or timed)."""
    skip = {"root", "decode_s", "in_chans"}
    fa, fb = dataclasses.asdict(a), dataclasses.asdict(b)
    return {k: (fa[k], fb[k]) for k in fa if k not in skip and fa[k] != pytest.approx(fb[k])}


def test_a_torchvision_dataset_and_the_same_images_as_a_folder_get_one_fingerprint_and_one_plan(tmp_path):
    data, folder = mnist_and_its_folder(tmp_path)
    from_dataset = fingerprint(torchvision_source("torch/mnist", str(data), download=False))
    from_folder = fingerprint(folder)
    assert same_facts(from_dataset, from_folder) == {}
    assert from_dataset.n_train == 40 and from_dataset.n_val == 10 and from_dataset.class_counts == [4] * 10
    assert from_dataset.grayscale == 1.0 and from_dataset.median_side == 28
    assert from_dataset.in_chans == from_folder.in_chans == 1  # what each DataModule trains on: grey, 1 channel
    assert from_dataset.decode_s == 0.0 and from_folder.decode_s > 0  # MNIST is held as arrays; files are decoded
    for budget in (None, 300.0, 4 * 3600.0):
        plans = [
            make_plan(dataclasses.replace(f, decode_s=1.0), CPU2, budget, elapsed_s=3.0, speed_fn=speeds_by_tokens)
            for f in (from_dataset, from_folder)
        ]
        assert plans[0].overrides == plans[1].overrides, budget


def test_cifar_files_give_the_counts_colour_and_size_of_the_set(tmp_path, monkeypatch):
    md5, data = write_cifar(tmp_path, n_train=50, n_test=10)
    trust_cifar_checksums(monkeypatch, "cifar10", md5)
    src = cifar_source("cifar10", str(tmp_path), download=False)
    f = fingerprint(src)
    labels = [y for name, (_, ys) in data.items() if name.startswith("data_batch") for y in ys]
    assert (f.n_train, f.n_val) == (50, 10) and f.class_counts == np.bincount(labels, minlength=10).tolist()
    assert (f.median_side, f.min_side, f.max_side, f.grayscale, f.in_chans) == (32, 32, 32, 0.0, 3)
    x, y = data["data_batch_1"]
    image = np.asarray(src.image(0))  # the first training image, as the dataset hands it out
    assert src.label(0) == y[0] and np.array_equal(image, x[0].reshape(3, 32, 32).transpose(1, 2, 0))


def test_litdata_chunks_give_the_folders_fingerprint(tmp_path):
    from vit.commands.streaming import main

    _, folder = mnist_and_its_folder(tmp_path)
    assert main(["optimize", str(folder), str(tmp_path / "chunks")]) == 0
    streamed = fingerprint(stream_source(str(tmp_path / "chunks")))
    assert same_facts(streamed, fingerprint(folder)) == {} and streamed.decode_s == 0.0  # decoded inside epochs


def test_a_source_the_planner_cannot_read_is_one_line(tmp_path):
    from jsonargparse import Namespace

    with pytest.raises(ValueError, match=r"plan a folder .*, CIFAR-10/100, torch/NAME, litdata chunks; not my.Data"):
        source_for(Namespace(class_path="my.Data", init_args=Namespace()))
    assert folder_source(mnist_and_its_folder(tmp_path)[1]).n_items == 40


# A tier whose recipe is a few epochs: the planned runs below take seconds, where the real tier for a few hundred
# images wants 60 epochs (the cap 120). Every other part of the plan and of FitBudget is the real code.
QUIET = ["--trainer.enable_progress_bar", "false", "--attention_maps.every_n_epochs", "0"]  # the maps: 1.7 s an epoch
SHORT_TIER = [(math.inf, 0, 16, 3, 2, (0.8, 1.0), False, 0.0, False, "adamw", 0.0)]


def test_bare_train_py_with_a_budget_plans_cifar10_ends_in_time_and_saves_plan_yaml(in_tmp, monkeypatch):
    """`python train.py --budget 3min` on CIFAR-10's files: configs/cifar10.yaml's data and a planned recipe (not its
    384x7 for 200 epochs); plan.yaml repeats it; the run ends within the budget + 5%."""
    md5, _ = write_cifar(in_tmp / "data", n_train=200, n_test=40)
    trust_cifar_checksums(monkeypatch, "cifar10", md5)
    monkeypatch.setattr("vit.planning.rules.TIERS", SHORT_TIER)
    start = time.time()
    monkeypatch.setattr("vit.run.planned.process_start", lambda: start)  # the budget counts from this test's start
    cli = train.main(["--budget", "3min", *QUIET])
    assert time.time() - start <= 1.05 * 180
    arch = cli.model.hparams.arch
    # planned: this tier's whole recipe fits the budget at CIFAR's own 8x8 grid
    assert (arch["embed_dim"], arch["depth"], arch["img_size"], arch["patch_size"]) == (64, 3, 32, 4)
    assert cli.datamodule.augmentation.rrc_scale == (0.8, 1.0) and cli.trainer.max_epochs >= 3
    plan_file = in_tmp / "logs" / "cifar10" / "version_0" / "plan.yaml"
    saved = yaml.safe_load(plan_file.read_text())
    assert saved["plan"] is False and saved["budget"] is None
    assert saved["data"]["class_path"] == "vit.data.CIFARDataModule" and saved["data"]["init_args"]["root"] == "data"
    assert saved["trainer"]["max_epochs"] == cli.trainer.max_epochs and saved["model"]["arch"]["embed_dim"] == 64


def test_torch_mnist_with_a_budget_trains_the_plan_on_one_channel_and_your_flags_win(in_tmp, monkeypatch):
    write_mnist(in_tmp / "data", n_train=64, n_test=16)
    monkeypatch.setattr("vit.planning.rules.TIERS", SHORT_TIER)
    monkeypatch.setattr("vit.run.planned.process_start", time.time)
    cli = train.main(["--config", "configs/mnist.yaml", "--data.init_args.download", "false", "--budget", "2min",
                      "--model.lr", "0.003", *QUIET])  # fmt: skip
    arch = cli.model.hparams.arch
    assert (arch["in_chans"], arch["img_size"], arch["patch_size"], arch["embed_dim"]) == (1, 32, 4, 64)  # planned
    assert cli.model.hparams.lr == 0.003  # yours
    assert cli.datamodule.augmentation.rrc_scale == (0.8, 1.0)
    assert (in_tmp / "logs" / "mnist" / "version_0" / "plan.yaml").is_file()
