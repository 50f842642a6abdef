"""Locality guidance (vit/training/teacher.py `LocalityGuidance`): every block imitates a teacher stage's features."""

import pytest
import torch
import torch.nn.functional as F
from conftest import SMOKE

import train
from vit.model.checkpoint import load_model
from vit.model.config import ViTConfig
from vit.training.module import ViTClassifier
from vit.training.teacher import LocalityGuidance, Teacher, teacher_channels

ARCH = ViTConfig(img_size=32, patch_size=8, embed_dim=16, depth=2, num_heads=2, num_classes=3)


def test_early_blocks_read_early_stages_and_the_loss_is_the_mse_to_each_stages_normalised_map():
    assert LocalityGuidance(8, [4, 5, 6, 7], depth=4).stage_of == [0, 1, 2, 3]
    assert LocalityGuidance(8, [4, 5, 6, 7], depth=2).stage_of == [0, 2]
    assert LocalityGuidance(8, [4, 5, 6, 7], depth=6).stage_of == [0, 0, 1, 2, 2, 3]
    guide = LocalityGuidance(8, [4, 6], depth=2)
    taps = [torch.randn(2, 12, 8), torch.randn(2, 12, 8)]  # a 3 x 4 token grid, row by row
    maps = [torch.randn(2, 4, 6, 8), torch.randn(2, 6, 2, 2)]  # finer, then coarser than the grid
    expected = []
    for tokens, proj, fmap in zip(taps, guide.proj, maps, strict=True):
        target = F.interpolate(fmap, size=(3, 4), mode="bilinear", antialias=True, align_corners=False)
        target = target.permute(0, 2, 3, 1).reshape(2, 12, -1)  # (B, N, C): position (r, c) at r * 4 + c
        target = (target - target.mean(-1, keepdim=True)) / (target.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
        expected.append(((proj(tokens) - target) ** 2).mean())
    assert guide(taps, maps, (3, 4)).item() == pytest.approx(torch.stack(expected).mean().item(), rel=1e-5)


def test_a_student_that_already_reads_the_teacher_pays_nothing():
    guide = LocalityGuidance(4, [4], depth=1)
    guide.proj[0].weight.data, guide.proj[0].bias.data = torch.eye(4), torch.zeros(4)
    fmap = torch.randn(2, 4, 3, 3)
    tokens = F.layer_norm(fmap.flatten(2).transpose(1, 2), (4,))  # (2, 9, 4): already the normalised map
    assert guide([tokens], [fmap], (3, 3)).item() == pytest.approx(0.0, abs=1e-10)


def test_the_training_loss_adds_the_weighted_guidance_with_one_teacher_forward_and_trains_the_maps():
    with pytest.raises(ValueError, match="guidance_weight=1.0 imitates a teacher's features: set --model.teacher"):
        ViTClassifier(arch=ARCH, guidance_weight=1.0)
    module = ViTClassifier(arch=ARCH, teacher="test_resnet", guidance_weight=2.0, distill_weight=0.25,
                           label_smoothing=0.0).eval()  # fmt: skip
    assert [p.out_features for p in module.guidance.proj] == [teacher_channels("test_resnet", 3)[i] for i in (0, 2)]
    teacher = Teacher("test_resnet", 3, 3, mean=[0.5] * 3, std=[0.5] * 3).eval()
    mean = std = torch.full((1, 3, 1, 1), 0.5)
    module.set_teacher(teacher, mean, std, {"val_acc": 0.5, "val_acc_balanced": 0.5})
    calls = []
    teacher.net.register_forward_pre_hook(lambda *a: calls.append(1))
    teacher.net.forward_intermediates = lambda x, f=teacher.net.forward_intermediates: (calls.append(1), f(x))[1]
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 0])
    loss = module.training_step((x, y), 0)
    assert len(calls) == 1  # the labels and the features from one pass
    with torch.no_grad():
        t_logits, maps = teacher.with_features(x)
        taps = []
        logits = module.model.forward_head(module.model.forward_features(x, taps))
        guidance = module.guidance([t[:, 1 if module.model.cls_token is not None else 0 :] for t in taps], maps, (4, 4))
    expected = 0.75 * F.cross_entropy(logits, y) + 0.25 * F.cross_entropy(logits, t_logits.argmax(-1)) + 2.0 * guidance
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.guidance.parameters())
    assert not any(p.grad is not None for p in teacher.parameters())  # frozen: read, never trained


def test_a_fit_with_drloc_and_guidance_saves_their_weights_beside_the_vit_and_predict_loads_the_vit_alone(in_tmp):
    cli = train.main(["fit", "--config", SMOKE, "--attention_maps.every_n_epochs", "0",
                      "--trainer.enable_progress_bar", "false", "--model.drloc_weight", "0.1",
                      "--model.teacher", "test_resnet", "--model.teacher_share", "0.5",
                      "--model.guidance_weight", "1.0"])  # fmt: skip
    last = in_tmp / "checkpoints" / "smoke" / "version_0" / "last.ckpt"
    state = torch.load(last, weights_only=True)["state_dict"]
    assert any(k.startswith("drloc.mlp.") for k in state) and any(k.startswith("guidance.proj.") for k in state)
    for name in ("drloc", "guidance"):
        for k, v in getattr(cli.model, name).state_dict().items():
            assert torch.equal(state[f"{name}.{k}"], v)
    model, _ = load_model(last)
    assert not any("drloc" in k or "guidance" in k for k in model.state_dict())
    x = torch.randn(2, model.cfg.in_chans, model.cfg.img_size, model.cfg.img_size)
    with torch.no_grad():
        assert torch.allclose(model(x), cli.model.model.eval()(x), atol=1e-5)
