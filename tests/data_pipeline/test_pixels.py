"""Pixels as they are: 16-bit images keep their levels to the normalisation, multi-band TIFFs train a model with that
many input channels, end to end (fit, predict, export)."""

import json
from pathlib import Path

import numpy as np
import pytest
import tifffile  # pinned in requirements.txt: a missing one fails the file, it does not skip it
import torch
from PIL import Image

from vit.data.folder import ImageFolderDataModule
from vit.data.images import load_image
from vit.data.transforms import DataError


def _grey_folder(root: Path, scale: int, seed: int = 0) -> np.ndarray:
    """Two classes of 8 grey 16x16 images (class b brighter), saved 8-bit (scale 1) or as 12 bits in a 16-bit PNG
    (scale 16: the same picture with 16 times the levels, as a 12-bit camera writes it)."""
    rng = np.random.default_rng(seed)
    for c, base in (("a", 40), ("b", 120)):
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(8):
            v = np.clip(base + rng.integers(0, 100, (16, 16)), 0, 255).astype(np.uint16)
            Image.fromarray(v.astype(np.uint8) if scale == 1 else v * scale).save(root / c / f"{i}.png")


def test_a_12_bit_folder_normalises_as_its_8_bit_copy_and_keeps_levels_8_bits_would_lose(tmp_path):
    _grey_folder(tmp_path / "eight", 1)
    _grey_folder(tmp_path / "twelve", 16)
    for in_memory in (True, False):
        dms = [
            ImageFolderDataModule(str(tmp_path / k), img_size=16, num_workers=0, in_memory=in_memory)
            for k in ("eight", "twelve")
        ]
        assert [dm.in_chans for dm in dms] == [1, 1]
        for dm in dms:
            dm.setup("fit")
        x8, x12 = (torch.stack([dm.val_set[i][0] for i in range(len(dm.val_set))]) for dm in dms)
        torch.testing.assert_close(x12, x8, atol=2e-3, rtol=0)  # the model sees the same inputs
    assert dms[1].memory == {} and ImageFolderDataModule(str(tmp_path / "twelve"), img_size=16).wide
    # the memory budget counts float pixels at four bytes a channel: the 12-bit folder needs 4x the 8-bit one's
    assert dms[1].need_gb == pytest.approx(4 * dms[0].need_gb)
    # 12 bits over the whole range: 4096 levels kept (an 8-bit detour kept 16 of them for values < 4096)
    ramp = (np.arange(4096, dtype=np.uint16).reshape(64, 64),)
    for c in ("a", "b"):
        (tmp_path / "ramp" / c).mkdir(parents=True)
        Image.fromarray(ramp[0]).save(tmp_path / "ramp" / c / "r.png")
        Image.fromarray(ramp[0][::-1].copy()).save(tmp_path / "ramp" / c / "s.png")
    dm = ImageFolderDataModule(str(tmp_path / "ramp"), img_size=64, num_workers=0, val_fraction=0.5)
    assert dm.memory["train"][0].dtype == torch.float32 and dm.memory["train"][0].unique().numel() == 4096


def _bands_folder(root: Path, bands: int = 5) -> None:
    """Two classes of 10 16-bit TIFFs with `bands` bands each, told apart by the last band only; half written
    band-interleaved (H, W, S), half planar (S, H, W), as satellite and microscopy tools write them."""
    rng = np.random.default_rng(0)
    for k, c in enumerate(("dark", "bright")):
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(10):
            x = rng.integers(0, 30000, (bands, 16, 16)).astype(np.uint16)
            x[-1] = 10000 + 40000 * k + rng.integers(0, 5000, (16, 16))
            if i % 2:
                tifffile.imwrite(root / c / f"{i}.tif", x, photometric="minisblack", planarconfig="separate")
            else:
                tifffile.imwrite(
                    root / c / f"{i}.tif", x.transpose(1, 2, 0), photometric="minisblack", planarconfig="contig"
                )


def test_a_5_band_tiff_reads_every_band_whichever_its_layout(tmp_path):
    _bands_folder(tmp_path)
    planar, interleaved = load_image(tmp_path / "dark" / "1.tif", None), load_image(tmp_path / "dark" / "0.tif", None)
    assert planar.shape == interleaved.shape == (5, 16, 16) and planar.dtype == torch.float32
    stored = tifffile.imread(tmp_path / "dark" / "1.tif")  # (5, 16, 16) uint16
    torch.testing.assert_close(planar, torch.from_numpy(stored.astype(np.float32) / 65535))
    with pytest.raises(ValueError, match=r"^5 bands, and the model takes 3$"):
        load_image(tmp_path / "dark" / "1.tif", 3)
    Image.new("RGB", (16, 16)).save(tmp_path / "dark" / "photo.png")
    with pytest.raises(DataError, match=r"different channel counts: .*photo.png has 3, .*tif has 5"):
        ImageFolderDataModule(str(tmp_path), img_size=16, num_workers=0)


def test_a_5_band_tiff_folder_trains_predicts_and_exports_a_5_channel_model(in_tmp, capsys):
    import onnxruntime as ort

    import train
    from vit.commands.export import main as export_main
    from vit.commands.predict import main as predict_main
    from vit.model.checkpoint import load_model

    _bands_folder(in_tmp / "bands")
    quick = ["--trainer.max_epochs", "2", "--data.init_args.num_workers", "0", "--model.arch.depth", "1"]
    quick += ["--trainer.enable_progress_bar", "false", "--data.init_args.img_size", "16"]
    quick += ["--data.init_args.auto_augment", "trivialaugment"]  # 8-bit tables: turned off with a warning
    cli = train.main(["fit", "--data.root", "bands", *quick])
    assert cli.datamodule.in_chans == 5 and cli.datamodule.wide
    ckpt = cli.trainer.checkpoint_callback.best_model_path
    model, hp = load_model(ckpt)
    assert hp.in_chans == 5 and len(hp.mean) == 5 and model.patch_embed.proj.in_channels == 5
    capsys.readouterr()
    Image.new("RGB", (16, 16)).save(in_tmp / "photo.png")
    tiffs = [str(in_tmp / "bands" / c / f"{i}.tif") for c in ("dark", "bright") for i in (0, 1)]
    assert predict_main(["--ckpt", ckpt, "--format", "json", *tiffs, str(in_tmp / "photo.png")]) == 1
    captured = capsys.readouterr()
    records = json.loads(captured.out)
    assert [len(r["predictions"]) for r in records[:4]] == [2, 2, 2, 2]
    assert "photo.png" in records[4]["path"] and "has 3 bands or fewer, and the model takes 5" in records[4]["error"]
    assert export_main(["--ckpt", ckpt, "--format", "onnx", "--out", str(in_tmp / "m.onnx")]) == 0
    meta = json.loads((in_tmp / "m.onnx.json").read_text())  # the sidecar: another runtime keeps the 5 bands
    assert next(s for s in meta["preprocess"] if s["step"] == "convert")["mode"] == "5 bands"
    session = ort.InferenceSession(str(in_tmp / "m.onnx"), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape[1:] == [5, 16, 16]
    dm = cli.datamodule
    x = torch.stack([dm.eval_tf(load_image(p, 5)) for p in tiffs])
    with torch.no_grad():
        ours = model.eval()(x)
    theirs = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    np.testing.assert_allclose(theirs, ours.numpy(), atol=1e-4)
