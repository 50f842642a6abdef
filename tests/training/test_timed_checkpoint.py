"""vit/training/timed_checkpoint.py: a checkpoint every interval of training time, with a few collectives, not one a
step."""

from datetime import timedelta

import lightning as L

import vit.training.timed_checkpoint as tc
from vit.data.digits import DigitsDataModule
from vit.model.config import ViTConfig
from vit.training.module import ViTClassifier


class _Clock:
    """time.monotonic for the callback: each training step takes exactly one second."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Tick(L.Callback):
    def __init__(self, clock):
        self.clock = clock

    def on_train_batch_start(self, *args):
        self.clock.now += 1.0


def test_saves_every_interval_of_training_with_few_broadcasts(tmp_path, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(tc.time, "monotonic", clock)
    ckpt = tc.TimedCheckpoint(timedelta(seconds=30), dirpath=tmp_path, filename="last-step", monitor=None)
    saved = []
    original = ckpt._save_checkpoint
    monkeypatch.setattr(
        ckpt, "_save_checkpoint", lambda trainer, path: (saved.append(trainer.global_step), original(trainer, path))
    )
    broadcasts = []
    module = ViTClassifier(arch=ViTConfig(embed_dim=16, depth=1, num_heads=1, patch_size=8))
    trainer = L.Trainer(
        max_steps=100,
        callbacks=[_Tick(clock), ckpt],
        logger=False,
        enable_checkpointing=True,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    strategy_broadcast = trainer.strategy.broadcast
    monkeypatch.setattr(
        trainer.strategy, "broadcast", lambda obj, src=0: (broadcasts.append(obj), strategy_broadcast(obj, src))[1]
    )
    trainer.fit(module, datamodule=DigitsDataModule(batch_size=32))
    assert saved == [30, 60, 90]  # one second a step, 30 s between saves
    assert (tmp_path / "last-step.ckpt").is_file()
    plans = [b for b in broadcasts if isinstance(b, tuple)]  # ours; Lightning broadcasts its folders at start
    assert ckpt.checks == len(plans) <= 5  # against one per step (100) with Lightning's train_time_interval
