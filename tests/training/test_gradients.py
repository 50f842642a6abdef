"""Gradient clipping on the device (ViTClassifier.configure_gradient_clipping, through torch's clip_grads_with_norm_ /
clip_grad_value_): equal to torch's clip_grad_norm_ / clip_grad_value_, and chosen by Lightning's `gradient_clip_val` /
`gradient_clip_algorithm` for every optimizer and precision we train with."""

import copy
from pathlib import Path

import lightning as L
import pytest
import torch

from vit.data.digits import DigitsDataModule
from vit.model.config import ViTConfig
from vit.training.module import ViTClassifier


class _RecordClipping(L.Callback):
    """Around the module's clipping: the gradients before and after, each step."""

    def __init__(self):
        self.steps = []

    def on_train_start(self, trainer, module):
        original = module.configure_gradient_clipping

        def wrapped(optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
            params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            before = [p.grad.detach().clone() for p in params]
            original(optimizer, gradient_clip_val, gradient_clip_algorithm)
            self.steps.append((before, [p.grad.detach().clone() for p in params]))

        module.configure_gradient_clipping = wrapped


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_clipping_trains_with_fused_adamw_and_muon_in_fp32_and_bf16(precision, optimizer, algorithm):
    """Lightning's own clipping raises for fused AdamW under bf16-mixed; ours clips every step as torch would."""
    clip = 0.05 if algorithm == "norm" else 1e-3  # small enough that every step clips
    module = ViTClassifier(arch=ViTConfig(embed_dim=32, depth=1, num_heads=2, patch_size=8), optimizer=optimizer)
    record = _RecordClipping()
    trainer = L.Trainer(
        max_steps=2,
        precision=precision,
        gradient_clip_val=clip,
        gradient_clip_algorithm=algorithm,
        callbacks=[record],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    before = copy.deepcopy(module.model.state_dict())
    trainer.fit(module, datamodule=DigitsDataModule(batch_size=16))
    assert trainer.global_step == 2 and len(record.steps) == 2
    for raw, clipped in record.steps:
        params = [torch.nn.Parameter(torch.zeros_like(g)) for g in raw]
        for p, g in zip(params, raw):
            p.grad = g.clone()
        if algorithm == "norm":
            torch.nn.utils.clip_grad_norm_(params, clip)
        else:
            torch.nn.utils.clip_grad_value_(params, clip)
        for got, p in zip(clipped, params):
            torch.testing.assert_close(got, p.grad)
    after = module.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the clipped steps were applied


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_bf16_run_with_gradient_clip_val_1_trains_from_the_command_line(optimizer, in_tmp):
    import train

    smoke = str(Path(__file__).parents[2] / "configs" / "smoke.yaml")
    flags = ["--trainer.precision", "bf16-mixed", "--trainer.gradient_clip_val", "1.0", "--model.optimizer", optimizer]
    quiet = ["--trainer.enable_progress_bar", "false", "--attention_maps.every_n_epochs", "0"]
    cli = train.main(["fit", "--config", smoke, *flags, *quiet])
    assert cli.trainer.global_step == 8 and cli.trainer.gradient_clip_val == 1.0
