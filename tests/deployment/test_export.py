import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from PIL import Image, ImageOps

from vit.commands.export import main
from vit.deployment.export import export
from vit.model.vision_transformer import VisionTransformer


@pytest.mark.parametrize(
    "cfg",
    [
        {},
        {"global_pool": "token", "pos_embed": "sincos2d"},
        {"stem": "resnet"},
        {"stem": "spt", "lsa": True},
        {"dist_token": True},
    ],
    # the conv stem is the residual one's subset (a conv, BN, ReLU); the EfficientNet stem's export is checked on a
    # trained hybrid checkpoint in tests/training/test_pretrained_cnn.py
    ids=["avg", "token", "resnetstem", "spt_lsa", "dist"],
)
def test_onnx_logits_match_pytorch_with_a_dynamic_batch(cfg, tmp_path):
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5, **cfg)
    path = export(model, "onnx", tmp_path / "m.onnx", img_size=32)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in (1, 3, 8):
        x = torch.randn(batch, 3, 32, 32)
        with torch.no_grad():
            ref = model(x).numpy()
        np.testing.assert_allclose(session.run(None, {"images": x.numpy()})[0], ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("stem", ["patch", "tf_efficientnet_lite0"])
def test_torchscript_matches_pytorch(stem, tmp_path):
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5, stem=stem)
    model.eval()
    path = export(model, "torchscript", tmp_path / "m.pt", img_size=32)
    loaded = torch.jit.load(str(path))
    for batch in (1, 4):
        x = torch.randn(batch, 3, 32, 32)
        torch.testing.assert_close(loaded(x), model(x), atol=1e-5, rtol=0)


def test_cli_writes_the_preprocessing_beside_the_model(tmp_path):
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3)
    hp = dict(
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=1,
        num_heads=2,
        num_classes=3,
        class_names=["a", "b", "c"],
        mean=[0.1, 0.2, 0.3],
        std=[0.4, 0.5, 0.6],
    )
    torch.save(
        {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}, "hyper_parameters": hp},
        tmp_path / "m.ckpt",
    )
    assert main(["--ckpt", str(tmp_path / "m.ckpt"), "--format", "torchscript", "--out", str(tmp_path / "m.pt")]) == 0
    meta = json.loads((tmp_path / "m.pt.json").read_text())
    assert meta["mean"] == [0.1, 0.2, 0.3] and meta["class_names"] == ["a", "b", "c"]
    assert meta["shape"][1:] == [3, 32, 32]
    assert main(["--ckpt", str(tmp_path / "nope.ckpt"), "--format", "onnx", "--out", str(tmp_path / "x.onnx")]) == 2


def _from_sidecar(path: Path, meta: dict) -> np.ndarray:
    """Another runtime's preprocessing: PIL and numpy only, every step read from the sidecar JSON (no vit code)."""
    img, bands = Image.open(path), None
    img.load()
    for step in meta["preprocess"]:
        kind = step["step"]
        if kind == "exif_transpose":
            img = ImageOps.exif_transpose(img)
        elif kind == "wide_pixels" and img.mode in step["modes"]:
            arr = np.asarray(img, dtype=np.float32)
            top = 65535.0 if img.mode.startswith("I;16") or arr.max() > 255 else 255.0
            img = Image.fromarray(arr / top, "F")  # one band, float; no 8-bit step
        elif kind == "composite_alpha" and img.mode in step["modes"]:
            background = Image.new("RGBA", img.size, (*step["background"], 255))
            img = Image.alpha_composite(background, img.convert("RGBA"))
        elif kind == "convert" and img.mode == "F":  # a wide band: repeated for 3 channels, resized per band
            bands = [img] * (3 if step["mode"] == "RGB" else 1)
        elif kind == "convert":
            img, bands = img.convert(step["mode"]), None
        elif kind == "resize":
            w, h = img.size
            s = step["size"]
            size = (s, int(s * h / w)) if w <= h else (int(s * w / h), s)
            img = img.resize(size, Image.BILINEAR)
            bands = [b.resize(size, Image.BILINEAR) for b in bands] if bands else None
        elif kind == "center_crop":
            (cw, ch), (w, h) = step["size"], img.size
            top, left = int(round((h - ch) / 2.0)), int(round((w - cw) / 2.0))
            img = img.crop((left, top, left + cw, top + ch))
            bands = [b.crop((left, top, left + cw, top + ch)) for b in bands] if bands else None
        elif kind == "to_float" and bands:  # wide: float already
            arr = np.stack([np.asarray(b, dtype=np.float32) for b in bands])
        elif kind == "to_float":
            arr = np.asarray(img, dtype=np.float32) / 255.0
            arr = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)  # (C, H, W)
        elif kind == "normalize":
            arr = (arr - np.array(step["mean"], np.float32)[:, None, None]) / np.array(step["std"], np.float32)[
                :, None, None
            ]
        elif kind not in ("wide_pixels", "composite_alpha"):
            raise AssertionError(f"a step this runtime does not know: {step}")
    return arr


def _files_in_every_mode(folder: Path) -> list[Path]:
    """Validation digits saved as RGBA, LA and transparent-palette files whose transparent pixels hide random colours
    (what `convert('RGB')` shows instead of white), grayscale, 16-bit, and a larger RGB file (resize and crop)."""
    from vit.data.digits import DigitsDataModule

    rng = np.random.default_rng(0)
    digits = DigitsDataModule().memory["val"][0][:4, 0].numpy()  # (4, 32, 32) uint8
    files = []
    for i, d in enumerate(digits):
        hole = rng.random(d.shape) < 0.3  # transparent pixels
        junk = rng.integers(0, 256, (*d.shape, 3), dtype=np.uint8)
        rgb = np.where(hole[..., None], junk, np.repeat(d[..., None], 3, -1))
        alpha = np.where(hole, 0, 255).astype(np.uint8)
        Image.fromarray(np.dstack([rgb, alpha]), "RGBA").save(folder / f"{i}_rgba.png")
        Image.fromarray(np.dstack([np.where(hole, junk[..., 0], d), alpha]), "LA").save(folder / f"{i}_la.png")
        pal = Image.fromarray(np.where(hole, 255, d // 2).astype(np.uint8), "P")  # index 255: transparent
        pal.putpalette([v for k in range(256) for v in ((min(2 * k, 255),) * 3 if k < 255 else (0, 200, 0))])
        pal.save(folder / f"{i}_palette.png", transparency=255)
        Image.fromarray(d, "L").save(folder / f"{i}_gray.png")
        Image.fromarray(d.astype(np.uint16) * 257).save(folder / f"{i}_deep16.png")
        deep = np.repeat(d, 2, 0).repeat(2, 1)[:40, :48].astype(np.uint16) * 16 + rng.integers(0, 16, (40, 48))
        Image.fromarray(deep.astype(np.uint16)).save(folder / f"{i}_deep12.png")  # 12 bits in 16, resized
        Image.fromarray(np.repeat(d, 2, 0).repeat(2, 1)).resize((48, 40)).convert("RGB").save(folder / f"{i}_big.png")
        files += [folder / f"{i}_{kind}.png" for kind in ("rgba", "la", "palette", "gray", "deep16", "deep12", "big")]
    return files


def test_onnx_fed_as_its_sidecar_says_gives_vit_predicts_answers(smoke_ckpt, smoke_onnx, tmp_path, capsys):
    from vit.commands.predict import main as predict_main

    meta = json.loads(Path(f"{smoke_onnx}.json").read_text())  # vit-export's (the session's smoke_onnx)
    assert meta["img_size"] == 32 and meta["in_chans"] == 3 and len(meta["class_names"]) == 10  # the README's keys
    (tmp_path / "imgs").mkdir()
    files = _files_in_every_mode(tmp_path / "imgs")
    assert {Image.open(f).mode for f in files} == {"RGBA", "LA", "P", "L", "I;16", "RGB"}
    capsys.readouterr()
    assert predict_main(["--ckpt", str(smoke_ckpt), "--format", "json", "--topk", "10", *map(str, files)]) == 0
    served = json.loads(capsys.readouterr().out)
    session = ort.InferenceSession(str(smoke_onnx), providers=["CPUExecutionProvider"])
    x = np.stack([_from_sidecar(f, meta) for f in files])
    # the sidecar's temperature calibrates the probabilities as vit-predict does
    assert meta["temperature"] == torch.load(smoke_ckpt, weights_only=True)["calibration"]["temperature"] != 1.0
    probs = (torch.from_numpy(session.run(None, {meta["input"]: x})[0]) / meta["temperature"]).softmax(-1).numpy()
    for rec, p in zip(served, probs):
        ours = {d["label"]: d["prob"] for d in rec["predictions"]}
        assert meta["class_names"][int(p.argmax())] == rec["predictions"][0]["label"], rec["path"]
        np.testing.assert_allclose([ours[c] for c in meta["class_names"]], p, atol=0.02, err_msg=rec["path"])


@pytest.mark.parametrize("cfg", [{}, {"global_pool": "token", "qk_norm": False, "norm_layer": "rmsnorm"}])
def test_timm_format_builds_timms_model_with_the_same_logits_and_reads_back(cfg, tmp_path, capsys):
    import timm
    from safetensors.torch import load_file

    from vit.model.pretrained import find_pretrained

    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=2, num_classes=3, **cfg)
    hp = dict(arch=model.cfg.to_dict(), class_names=["a", "b", "c"], mean=[0.1, 0.2, 0.3], std=[0.4, 0.5, 0.6])
    sd = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save({"state_dict": sd, "hyper_parameters": hp}, tmp_path / "m.ckpt")
    out = tmp_path / "timm"
    assert main(["--ckpt", str(tmp_path / "m.ckpt"), "--format", "timm", "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    theirs = timm.models.VisionTransformer(**config["model_args"]).eval()  # what a timm user writes
    theirs.load_state_dict(load_file(out / "model.safetensors"))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), model.eval()(x), atol=1e-5, rtol=0)
    data = timm.data.resolve_data_config(pretrained_cfg=config["pretrained_cfg"])
    assert tuple(data["mean"]) == (0.1, 0.2, 0.3) and tuple(data["input_size"]) == (3, 32, 32)
    assert config["label_names"] == ["a", "b", "c"]
    weights = find_pretrained(out)  # and back: the folder is weights to start from
    assert weights.arch["num_heads"] == 2 and weights.mean == (0.1, 0.2, 0.3)
    gqa = VisionTransformer(img_size=32, patch_size=8, embed_dim=48, depth=1, num_heads=2, num_kv_heads=1)
    torch.save(
        {"state_dict": {f"model.{k}": v for k, v in gqa.state_dict().items()},
         "hyper_parameters": {"arch": gqa.cfg.to_dict(), "mean": [0.5] * 3, "std": [0.5] * 3}},
        tmp_path / "gqa.ckpt",
    )  # fmt: skip
    assert main(["--ckpt", str(tmp_path / "gqa.ckpt"), "--format", "timm", "--out", str(tmp_path / "g")]) == 2
    assert "only the plain model converts" in capsys.readouterr().err and not (tmp_path / "g").exists()


def test_int8_onnx_quantizes_the_matrix_products_and_vit_predict_runs_it(smoke_ckpt, smoke_onnx, tmp_path, capsys):
    import onnx

    from vit.commands.predict import main as predict_main

    fp32, int8 = smoke_onnx, tmp_path / "m-int8.onnx"  # fp32: vit-export's, the session's
    assert main(["--ckpt", str(smoke_ckpt), "--format", "onnx", "--quantize", "int8", "--out", str(int8)]) == 0
    assert json.loads(Path(f"{int8}.json").read_text())["quantized"] == "int8"
    graph = onnx.load(str(int8)).graph
    weights = {t.name for t in graph.initializer}
    assert sum(n.op_type == "MatMulInteger" for n in graph.node) >= 5  # qkv, proj, fc1, fc2 per block, the head
    # every product with a weight is int8; the attention's own two (q k^T, attention x v) stay float
    assert not [n.name for n in graph.node if n.op_type in ("MatMul", "Gemm") and set(n.input) & weights]
    # convolutions stay float: ONNX Runtime's ConvInteger made a hybrid's CNN 7.7x slower (docs/performance.md)
    assert not [n.name for n in graph.node if n.op_type == "ConvInteger"]
    (tmp_path / "imgs").mkdir()
    files = [str(f) for f in _files_in_every_mode(tmp_path / "imgs")]
    answers = {}
    for flag, model in (("--ckpt", smoke_ckpt), ("--onnx", fp32), ("--onnx", int8)):
        capsys.readouterr()
        assert predict_main([flag, str(model), "--format", "json", "--topk", "10", *files]) == 0
        answers[str(model)] = [
            {p["label"]: p["prob"] for p in r["predictions"]} for r in json.loads(capsys.readouterr().out)
        ]
    torch_probs, fp32_probs, int8_probs = (
        np.array([[rec[c] for c in sorted(rec)] for rec in answers[str(m)]]) for m in (smoke_ckpt, fp32, int8)
    )
    np.testing.assert_allclose(fp32_probs, torch_probs, atol=1e-4)  # same preprocessing and calibration as --ckpt
    assert np.abs(int8_probs - torch_probs).max() < 0.05
    assert (int8_probs.argmax(1) == torch_probs.argmax(1)).mean() >= 0.9


def test_bad_int8_and_onnx_requests_are_one_line(smoke_ckpt, smoke_onnx, tmp_path, capsys):
    import shutil

    from vit.commands.predict import main as predict_main

    with pytest.raises(SystemExit) as e:
        main(["--ckpt", str(smoke_ckpt), "--format", "torchscript", "--quantize", "int8", "--out", str(tmp_path / "x")])
    assert e.value.code == 2 and "--quantize int8 needs --format onnx" in capsys.readouterr().err
    bare = Path(shutil.copy(smoke_onnx, tmp_path / "bare.onnx"))  # the session's export, without its sidecar
    assert predict_main(["--onnx", str(bare), str(bare)]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"error: {bare}: no bare.onnx.json beside it (vit-export writes the preprocessing there)"
    )
    with pytest.raises(SystemExit):
        predict_main(["--onnx", str(bare), "--attention-out", str(tmp_path), str(bare)])
