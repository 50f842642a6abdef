"""Every shipped config trains as shipped: a few steps each on tiny data in the exact on-disk format its data module
reads (CIFAR archives, a folder of PNGs, litdata chunks, MNIST's idx files, a timm weights file). Only the trainer's
length and batch count are limited, and the batch size of the large-model configs: precision, clipping, augmentation,
optimizer and model are the config's.

    pytest -m configs          # these alone
"""

import multiprocessing
from pathlib import Path

import numpy as np
import pytest
import torch
from formats import trust_cifar_checksums, write_cifar, write_mnist
from PIL import Image

import train
from vit.model.checkpoint import load_model

CONFIG_DIR = Path(__file__).parent.parent / "configs"
CONFIGS = sorted(p.name for p in CONFIG_DIR.glob("*.yaml"))
VARIANTS = sorted(p.name for p in (CONFIG_DIR / "variants").glob("*.yaml"))
assert len(CONFIGS) >= 8 and len(VARIANTS) >= 10, "the config lists come from disk: an empty glob would test nothing"
# The trainer's length and batch count, and how many images the attention-map callback draws and scores: none (its
# 32 faithfulness curves were a third of a CIFAR config's test, and 2 images' curves still 2 s of a 384 x 7 one's 13 s;
# tests/evaluation/test_callbacks.py checks the curves reach TensorBoard).
# A limit of 1 is parsed as 1.0, all the batches (the Trainer's signature reads Union[float, int], and jsonargparse
# tries float first): 2 is two batches.
LIMITS = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=2"]
LIMITS += ["--attention_maps.num_images=2", "--attention_maps.faithfulness_images=0"]
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
# The batch size changes no code path (Mixup/CutMix need an even one), and on a CPU without bf16 instructions (AVX2
# only) bf16 autocast runs ~12x slower than fp32: a step of 384x7 at batch 8 measured 11.7 s against fp32's 0.9 s, so
# the shipped batch of 128 made each CIFAR config's test take 480 s there and the ViT-S/16 one over 25 minutes.
SMALL_BATCH = ["--data.init_args.batch_size=2", "--data.init_args.eval_batch_size=2"]

pytestmark = pytest.mark.configs


def _png_folder(root: Path, classes=("a", "b", "c"), n=24) -> None:
    rng = np.random.default_rng(0)
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(n):
            Image.fromarray(rng.integers(0, 256, (28 + i % 5, 30, 3), dtype=np.uint8)).save(root / c / f"{i}.png")


def _data_for(config: str, root: Path, monkeypatch) -> list[str]:
    """Write the files the config reads, relative to root (the working folder); the flags it needs besides."""
    extra: list[str] = []
    if config.startswith("cifar"):
        dataset = "cifar100" if "100" in config else "cifar10"
        md5, _ = write_cifar(root / "data", dataset, n_train=20, n_test=8)
        trust_cifar_checksums(monkeypatch, dataset, md5)
        extra = SMALL_BATCH
    if config == "cifar10_finetune.yaml":
        import timm
        from safetensors.torch import save_file

        # the config names the weights; they are read from a Hugging Face cache that this test writes, offline
        vit_s = timm.create_model("vit_small_patch16_224", pretrained=False)  # the architecture, never the hub
        snapshot = root / "hub" / "models--timm--vit_small_patch16_224.augreg_in21k_ft_in1k" / "snapshots" / "x"
        snapshot.mkdir(parents=True)
        save_file(vit_s.state_dict(), str(snapshot / "model.safetensors"))
        monkeypatch.setenv("HF_HUB_CACHE", str(root / "hub"))
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        # ViT-S/16 from the timm file, two steps, at 32 px: its 14x14 position grid resampled to 2x2 (as any other
        # img_size would be; tests/model/test_interop.py checks the resampling). At the shipped 224 px, one bf16 step
        # did not end in 16 minutes on an AVX2-only CPU (bf16 matmuls fall back to a reference gemm there). Its maps
        # are off: the callback is tested on the small configs and in tests/evaluation/test_callbacks.py.
        size = ["--data.init_args.img_size=32", "--attention_maps.every_n_epochs=0"]
        return [*SMALL_BATCH, *size]
    if config == "folder.yaml":
        _png_folder(root / "images")
        return ["--data.root", str(root / "images")]
    if config == "mnist.yaml":
        write_mnist(root / "data", "MNIST", n_train=260, n_test=20)
        return ["--data.init_args.download=false"]
    if config == "streaming.yaml":
        from vit.commands.streaming import main as streaming

        _png_folder(root / "images" / "train", n=8)  # more than two training batches of 8
        _png_folder(root / "images" / "val", n=4)
        assert streaming(["optimize", str(root / "images"), str(root / "chunks")]) == 0
        return ["--data.init_args.batch_size=8"]
    return extra


@pytest.mark.parametrize("config", CONFIGS)
def test_every_config_trains_as_shipped(config, in_tmp, monkeypatch, capsys):
    extra = _data_for(config, in_tmp, monkeypatch)
    cli = train.main(["fit", "--config", f"configs/{config}", *LIMITS, *QUIET, *extra])
    assert cli.trainer.global_step >= 1
    # the run's loader workers have exited with it (litdata's, left to the garbage collector, stalled for 10 s)
    assert not multiprocessing.active_children()
    # every run, planned (folder.yaml) or fixed, says how long it takes here after its first steps
    printed = capsys.readouterr().out
    assert "this recipe: " in printed, printed[-2000:]
    last = next(in_tmp.glob("checkpoints/*/version_0/last.ckpt"))
    model, _ = load_model(last)
    cfg = model.cfg
    assert (cfg.num_classes, cfg.img_size) == (cli.datamodule.num_classes, cli.datamodule.img_size)
    if config == "cifar10_finetune.yaml":  # the augreg weights' own normalisation (timm's registry), not CIFAR's
        assert cli.datamodule.mean == (0.5, 0.5, 0.5) and cli.model.hparams.std == [0.5, 0.5, 0.5]
    with torch.no_grad():
        assert torch.isfinite(model(torch.zeros(1, cfg.in_chans, cfg.img_size, cfg.img_size))).all()


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_trains_on_top_of_digits(variant, in_tmp):
    cli = train.main(
        ["fit", "--config", "configs/digits.yaml", "--config", f"configs/variants/{variant}", *LIMITS, *QUIET]
    )
    assert cli.trainer.global_step == 2
    assert torch.isfinite(torch.stack([p.detach().sum() for p in cli.model.parameters()])).all()
    # the variant's checkpoint loads back as data into the same model (its fields are saved and rebuilt)
    model, _ = load_model(in_tmp / "checkpoints" / "digits" / "version_0" / "last.ckpt")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), cli.model.model.eval()(x), atol=1e-6, rtol=0)


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
def test_a_cifar_batch_pickled_with_bytes_keys_is_one_line_naming_it(dataset, in_tmp, monkeypatch):
    md5, _ = write_cifar(in_tmp / "data", dataset, n_train=10, n_test=2, bytes_keys=True)
    trust_cifar_checksums(monkeypatch, dataset, md5)  # the checksums pass: only the layout is wrong
    with pytest.raises(SystemExit) as e:
        train.main(["--config", f"configs/{dataset}.yaml"])
    message = str(e.value)
    assert message.startswith("error: data/cifar-") and "keys are bytes" in message and "\n" not in message


def test_a_cifar_meta_file_without_label_names_is_one_line_naming_it(in_tmp, monkeypatch):
    import pickle

    md5, _ = write_cifar(in_tmp / "data", "cifar10", n_train=10, n_test=2)
    meta = in_tmp / "data" / "cifar-10-batches-py" / "batches.meta"
    meta.write_bytes(pickle.dumps({"names": ["x"]}, protocol=2))
    md5["batches.meta"] = __import__("hashlib").md5(meta.read_bytes()).hexdigest()
    trust_cifar_checksums(monkeypatch, "cifar10", md5)
    with pytest.raises(SystemExit) as e:
        train.main(["--config", "configs/cifar10.yaml"])
    assert str(e.value) == "error: data/cifar-10-batches-py/batches.meta: no key 'label_names' (has ['names'])"


@pytest.mark.parametrize("damage", ["magic", "truncated"])
def test_a_foreign_or_truncated_mnist_file_is_one_line_naming_it(damage, in_tmp):
    write_mnist(in_tmp / "data", "MNIST", n_train=20, n_test=10)
    path = in_tmp / "data" / "MNIST" / "raw" / "train-images-idx3-ubyte"
    raw = path.read_bytes()
    path.write_bytes(b"\x00\x00\x09\x99" + raw[4:] if damage == "magic" else raw[:-100])
    with pytest.raises(SystemExit) as e:
        train.main(["--config", "configs/mnist.yaml", "--data.init_args.download=false"])
    message = str(e.value)
    assert message.startswith("error: data/MNIST/raw/train-images-idx3-ubyte: ") and "\n" not in message
    assert ("magic number 0x999" if damage == "magic" else "needs 15696") in message, message
