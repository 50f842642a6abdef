"""vit/training/teacher.py: a CNN teacher trained inside the run, DeiT's hard distillation, the teacher file."""

import dataclasses
import inspect

import pytest
import torch
import torch.nn.functional as F
from conftest import SMOKE
from safetensors.torch import save_file

import train
from vit.model.config import ViTConfig
from vit.training.module import ViTClassifier
from vit.training.teacher import (
    TEACHER_FILE,
    Teacher,
    TeacherFit,
    check_teacher_name,
    epoch_batches,
    load_teacher,
)

TINY = ViTConfig(img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=4)


class Constant(torch.nn.Module):
    """A stand-in CNN that always answers `cls` and records what it was shown."""

    def __init__(self, cls: int, classes: int = 4):
        super().__init__()
        self.logits = torch.nn.functional.one_hot(torch.tensor(cls), classes).float() * 5
        self.seen: list[torch.Tensor] = []

    def forward(self, x):
        self.seen.append(x)
        return self.logits.expand(len(x), -1)


def test_the_distilled_loss_mixes_the_labels_and_the_teachers_class_seen_in_its_own_normalisation():
    module = ViTClassifier(arch=TINY, label_smoothing=0.0, distill_weight=0.25)
    module.eval()  # no dropout: the same logits twice
    teacher = Teacher("test_resnet", 4, 3, mean=[0.2] * 3, std=[0.1] * 3)
    teacher.net = Constant(cls=3)
    mean, std = torch.full((1, 3, 1, 1), 0.5), torch.full((1, 3, 1, 1), 0.25)
    module.set_teacher(teacher, mean, std, {"val_acc": 0.9, "val_acc_balanced": 0.8})
    x, y = torch.randn(6, 3, 16, 16), torch.tensor([0, 1, 2, 0, 1, 2])
    with torch.no_grad():
        loss = module.training_step((x, y), 0)
        logits = module(x)
    expected = 0.75 * F.cross_entropy(logits, y) + 0.25 * F.cross_entropy(logits, torch.full_like(y, 3))
    torch.testing.assert_close(loss, expected)
    # the teacher saw the pixels (x * 0.25 + 0.5) normalised its way ((. - 0.2) / 0.1)
    torch.testing.assert_close(teacher.net.seen[0], (x * 0.25 + 0.5 - 0.2) / 0.1)
    assert not any("teacher" in k for k in module.state_dict())  # only the ViT is saved
    assert module.teacher_scores == {"teacher/val_acc": 0.9, "teacher/val_acc_balanced": 0.8}


def test_a_teacher_file_reloads_with_the_same_answers_and_a_wrong_one_is_named(tmp_path):
    teacher = Teacher("test_resnet", 4, 1, mean=[0.3], std=[0.2]).eval()
    teacher.save(tmp_path / "t.safetensors", epochs=3, val_acc=0.5)
    again, record = load_teacher(tmp_path / "t.safetensors", num_classes=4, in_chans=1)
    x = torch.randn(2, 1, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(x), teacher(x))
    assert record["epochs"] == 3 and record["name"] == "test_resnet" and record["mean"] == pytest.approx([0.3])
    with pytest.raises(ValueError, match=r"t.safetensors: the teacher has 4 classes and 1 channels, the run 10 and 1"):
        load_teacher(tmp_path / "t.safetensors", num_classes=10, in_chans=1)
    save_file({"w": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match=r"other.safetensors: not a teacher file"):
        load_teacher(tmp_path / "other.safetensors", num_classes=4, in_chans=1)
    with pytest.raises(ValueError, match=r"teacher='resnet_nope': neither a timm model name"):
        check_teacher_name("resnet_nope")
    with pytest.raises(ValueError, match=r"teacher='gone.safetensors': no such file"):
        ViTClassifier(arch=TINY, teacher="gone.safetensors")
    with pytest.raises(ValueError, match=r"distillation takes one label an image, not task='multilabel'"):
        ViTClassifier(arch=TINY, teacher="test_resnet", task="multilabel")


def test_fit_trains_the_teacher_first_saves_it_and_a_second_run_reuses_the_file(in_tmp, monkeypatch):
    args = ["fit", "--config", SMOKE, "--attention_maps.every_n_epochs", "0", "--trainer.enable_progress_bar", "false"]
    callers = []  # who asked the teacher: its own epoch (train), its scoring (score) or the student's loss
    forward = Teacher.forward

    def counted(self, x):
        callers.append(next(f.function for f in inspect.stack() if f.function in ("forward_train", "score", "train")))
        return forward(self, x)

    monkeypatch.setattr(Teacher, "forward", counted)
    cli = train.main([*args, "--model.teacher", "test_resnet", "--model.teacher_share", "0.5"])
    # its epoch and its validation pass are the student's: 4 and 2 batches (smoke.yaml's limit_*_batches)
    assert callers.count("train") == 4 and callers.count("score") == 2
    callers.clear()
    folder = in_tmp / "checkpoints" / "smoke" / "version_0"
    ckpt = torch.load(folder / "last.ckpt", weights_only=True)
    record = ckpt["teacher"]
    assert record["name"] == "test_resnet" and record["epochs"] == 1  # 0.5 of max_epochs=2, without a budget
    assert 0.0 <= record["val_acc"] <= 1.0 and record["seconds"] > 0
    assert cli.trainer.callback_metrics["teacher/val_acc"] == pytest.approx(record["val_acc"], abs=1e-4)
    assert all(k.startswith("model.") for k in ckpt["state_dict"])  # the ViT alone
    assert not cli.model.teacher.training and not any(p.requires_grad for p in cli.model.teacher.parameters())

    train.main([*args, "--model.teacher", str(folder / TEACHER_FILE)])
    again = in_tmp / "checkpoints" / "smoke" / "version_1"
    assert torch.load(again / "last.ckpt", weights_only=True)["teacher"]["epochs"] == record["epochs"]
    assert not (again / TEACHER_FILE).exists()  # reused, not trained again
    assert callers.count("forward_train") == 2 * 4  # every training step of the 2 epochs of 4 batches
    assert callers.count("score") >= 1 and callers.count("train") == 0

    def no_training(*args):
        raise AssertionError("a resumed run trained a second teacher")

    monkeypatch.setattr(TeacherFit, "train", no_training)  # resuming reloads the file the run wrote
    cli = train.main([*args, "--model.teacher", "test_resnet", "--ckpt_path", str(folder / "last.ckpt"),
                      "--trainer.max_epochs", "3"])  # fmt: skip
    assert cli.trainer.current_epoch == 3 and cli.model.teacher_record["epochs"] == record["epochs"]


def test_an_epoch_counts_batches_as_lightnings_limit_train_batches_does():
    assert [epoch_batches(10, limit) for limit in (None, 4, 40, 0.25, 1.0, 0.01)] == [10, 4, 10, 2, 10, 1]


def test_the_distillation_token_learns_the_teachers_class_and_the_class_head_the_labels():
    arch = dataclasses.replace(TINY, dist_token=True)
    module = ViTClassifier(arch=arch, label_smoothing=0.0, distill_weight=0.25, teacher="test_resnet")
    module.eval()  # no dropout: the same logits twice
    teacher = Teacher("test_resnet", 4, 3, mean=[0.5] * 3, std=[0.25] * 3)
    teacher.net = Constant(cls=3)
    module.set_teacher(teacher, torch.full((1, 3, 1, 1), 0.5), torch.full((1, 3, 1, 1), 0.25), {"val_acc": 0.9,
                       "val_acc_balanced": 0.8})  # fmt: skip
    x, y = torch.randn(6, 3, 16, 16), torch.tensor([0, 1, 2, 0, 1, 2])
    with torch.no_grad():
        loss = module.training_step((x, y), 0)
        logits, dist = module.model.forward_heads(module.model.forward_features(x))
        served = module(x)
    assert not torch.allclose(logits, dist)  # two heads on two tokens
    expected = 0.75 * F.cross_entropy(logits, y) + 0.25 * F.cross_entropy(dist, torch.full_like(y, 3))
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(served, (logits + dist) / 2)  # DeiT's answer: the mean of the two heads
    with pytest.raises(ValueError, match=r"dist_token=true: .* set --model.teacher"):
        ViTClassifier(arch=arch)


def test_a_distilled_fit_saves_both_heads_and_the_post_hoc_tau_moves_their_mean(in_tmp, monkeypatch):
    from vit.data.digits import DigitsDataModule
    from vit.evaluation import logit_adjustment
    from vit.model.checkpoint import load_model

    args = ["fit", "--config", SMOKE, "--trainer.enable_progress_bar", "false", "--model.arch.dist_token", "true",
            "--model.teacher", "test_resnet", "--model.teacher_share", "0.5"]  # fmt: skip
    train.main(args)  # the attention maps callback draws the distilled model every epoch
    path = in_tmp / "checkpoints" / "smoke" / "version_0" / "last.ckpt"
    sd = torch.load(path, weights_only=True)["state_dict"]
    assert sd["model.dist_token"].shape == (1, 1, 32) and "model.head_dist.weight" in sd
    model, hp = load_model(path)
    x = (DigitsDataModule(img_size=hp.img_size).memory["val"][0][:50].float() / 255 - 0.5) / 0.5
    counts = [100, 50, 25, 12, 6, 3, 2, 1, 1, 1]
    monkeypatch.setattr(logit_adjustment, "choose_tau", lambda *a: {"tau": 1.0})
    batches = [(x, torch.zeros(50, dtype=torch.long))]
    logit_adjustment.adjust_checkpoints([str(path)], batches, counts, torch.device("cpu"))
    adjusted, _ = load_model(path)
    with torch.no_grad():
        torch.testing.assert_close(adjusted(x), model(x) - logit_adjustment.log_prior(counts), atol=1e-5, rtol=1e-5)
