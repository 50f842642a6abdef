"""Property-based fuzzing of the two doors where outside input comes in: image files and configuration values.
Either a clean result or a clean one-line error, never a crash, a hang, or a silently broken result."""

import dataclasses
import io
import math
import tempfile
import typing
from pathlib import Path

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from vit.data.images import describe, read_image
from vit.deployment.export import export
from vit.model.config import ViTConfig
from vit.model.vision_transformer import VisionTransformer


def _encoded() -> list[bytes]:
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 255, (12, 16, 3), dtype=np.uint8))
    out = []
    for img, fmt in (
        (rgb, "PNG"),
        (rgb, "JPEG"),
        (rgb.convert("P"), "GIF"),
        (rgb, "BMP"),
        (rgb.convert("L"), "PNG"),
        (rgb.convert("RGBA"), "PNG"),
        (Image.fromarray(rng.integers(0, 65535, (9, 7)).astype(np.uint16)), "PNG"),
    ):
        buf = io.BytesIO()
        img.save(buf, format=fmt)
        out.append(buf.getvalue())
    return out


SEEDS = _encoded()


@st.composite
def mutated_images(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "header"]))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[pos] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del data[pos:]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "header" and len(data) > 24:  # sizes in the header: the decompression-bomb door
            data[16:24] = draw(st.binary(min_size=8, max_size=8))
    return bytes(data)


# derandomize: CI explores the same examples every run (a failure is reproducible, not a flake)
@settings(
    max_examples=2000, deadline=2000, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=mutated_images())
def test_mutated_image_files_give_an_image_or_a_clean_error(data, tmp_path):
    path = tmp_path / "x.img"
    path.write_bytes(data)
    try:
        img = read_image(path)
    except Exception as e:  # noqa: BLE001 - the property: whatever fails, describe() gives one clean line
        reason = describe(e)
        assert reason and "\n" not in reason and len(reason) < 500
        return
    if isinstance(img, torch.Tensor):  # more than 8 bits a sample (a header mutated to 16-bit): float in [0, 1]
        assert img.dtype == torch.float32 and img.ndim == 3 and img.shape[0] == 3 and min(img.shape[1:]) >= 1
        assert bool(((img >= 0) & (img <= 1)).all())
        return
    assert img.mode == "RGB" and img.width >= 1 and img.height >= 1
    assert np.asarray(img).shape == (img.height, img.width, 3)


FIELDS = [f.name for f in dataclasses.fields(ViTConfig)]  # every field, the variants' cross-field rules included
CHOICES = sorted({c for f in dataclasses.fields(ViTConfig) for c in typing.get_args(f.type) if isinstance(c, str)})
CONFIG_VALUES = st.one_of(
    st.integers(-3, 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.sampled_from([*CHOICES, "x"]),  # every field's own choices (stems, patterns, norms ...) and one that is none
)
BASE = dict(img_size=16, patch_size=8, in_chans=3, num_classes=5, embed_dim=16, depth=1, num_heads=2)


@settings(max_examples=600, deadline=5000, derandomize=True)
@given(changes=st.dictionaries(st.sampled_from(FIELDS), CONFIG_VALUES, min_size=1, max_size=3))
def test_fuzzed_config_values_build_a_working_model_or_name_the_field(changes):
    """Any ViTConfig either stops with one line naming a field, or builds a model that runs, trains a step with
    finite gradients, and reloads from its saved config and weights with the same logits."""
    cfg = {**BASE, **changes}
    try:
        model = VisionTransformer(**cfg)
    except ValueError as e:
        message = str(e)
        assert "\n" not in message and any(f"{name}=" in message for name in FIELDS), message
        return
    # it built: it must also run and give finite logits of the promised shape
    x = torch.randn(2, cfg["in_chans"], cfg["img_size"], cfg["img_size"])
    with torch.no_grad():
        out = model.eval()(x)
    assert out.shape == (2, cfg["num_classes"]) if cfg["num_classes"] else out.shape == (2, cfg["embed_dim"])
    assert torch.isfinite(out).all()
    assert not math.isnan(float(out.sum()))
    model.train()(x).square().mean().backward()  # a training step's backward (dropout, drop path, patch drop on)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    again = VisionTransformer(ViTConfig.from_dict(model.cfg.to_dict()))  # as a checkpoint reloads it
    again.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(x), model.eval()(x))


# A trace costs ~0.1 s a model: a fifth of the examples above, drawn the same way
@settings(max_examples=120, deadline=5000, derandomize=True)
@given(changes=st.dictionaries(st.sampled_from(FIELDS), CONFIG_VALUES, min_size=1, max_size=3))
def test_fuzzed_configs_that_build_export_and_load_with_the_same_logits(changes):
    """A ViTConfig that builds also exports (vit-export's TorchScript trace; an ONNX export takes seconds a model:
    tests/deployment/test_export.py exports the pools, stems and LSA) to a file that loads and gives its logits."""
    cfg = {**BASE, **changes}
    try:
        model = VisionTransformer(**cfg).eval()
    except ValueError:
        return  # the test above checks the message
    x = torch.randn(2, cfg["in_chans"], cfg["img_size"], cfg["img_size"])
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        path = export(model, "torchscript", Path(tmp, "m.pt"), cfg["img_size"], cfg["in_chans"])
        torch.testing.assert_close(torch.jit.load(str(path))(x), model(x))
