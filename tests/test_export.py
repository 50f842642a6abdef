import json

import numpy as np
import onnxruntime as ort
import pytest
import torch

from vit.export import export, main
from vit.model import VisionTransformer


@pytest.mark.parametrize("cfg", [{}, {"global_pool": "token", "pos_embed": "sincos2d"}], ids=["avg", "token"])
def test_onnx_logits_match_pytorch_with_a_dynamic_batch(cfg, tmp_path):
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5, **cfg)
    path = export(model, "onnx", tmp_path / "m.onnx", img_size=32)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in (1, 3, 8):
        x = torch.randn(batch, 3, 32, 32)
        with torch.no_grad():
            ref = model(x).numpy()
        np.testing.assert_allclose(session.run(None, {"images": x.numpy()})[0], ref, atol=1e-4, rtol=0)


def test_torchscript_matches_pytorch(tmp_path):
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5)
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
