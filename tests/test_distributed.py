"""Data-parallel training through Lightning's own DDP (ddp_spawn, gloo, 2 CPU processes)."""

import lightning as L
import pytest
import torch

from vit.data import DigitsDataModule
from vit.module import ViTClassifier

MODEL = dict(arch=dict(patch_size=8, embed_dim=32, depth=2, num_heads=2), warmup_epochs=0.5)


def _fit(devices: int, batch_size: int, tmp_path):
    L.seed_everything(0)
    module = ViTClassifier(**MODEL)
    extra = {"strategy": "ddp_spawn"} if devices > 1 else {}
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        max_epochs=2,
        limit_train_batches=5,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        **extra,
    )
    # no crop: the augmentation draws differ between ranks, the data must not
    trainer.fit(module, datamodule=DigitsDataModule(batch_size=batch_size, crop_padding=0))
    return module, {k: v.item() for k, v in trainer.callback_metrics.items()}


def test_ddp_on_two_processes_matches_one_process_with_the_same_global_batch(tmp_path):
    single, single_metrics = _fit(1, 32, tmp_path / "one")
    ddp, ddp_metrics = _fit(2, 16, tmp_path / "two")
    for (name, a), b in zip(single.state_dict().items(), ddp.state_dict().values()):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4, msg=name)
    # Synced: the 2-process val/acc and val/loss are over the whole validation set, as the single process's.
    assert ddp_metrics["val/acc"] == pytest.approx(single_metrics["val/acc"], abs=1e-6)
    assert ddp_metrics["val/loss"] == pytest.approx(single_metrics["val/loss"], abs=1e-4)
