"""Data-parallel training through Lightning's own DDP (gloo, 2 CPU processes): ddp_fork in this process (a spawned
process re-imports torch, ~10 s each on a 2-core CPU), ddp_spawn where the command line is tested."""

import lightning as L
import pytest
import torch

from vit.data.digits import DigitsDataModule
from vit.training.module import ViTClassifier

MODEL = dict(arch=dict(patch_size=8, embed_dim=32, depth=2, num_heads=2), warmup_epochs=0.5)


def _fit(devices: int, batch_size: int, tmp_path):
    L.seed_everything(0)
    module = ViTClassifier(**MODEL)
    extra = {"strategy": "ddp_fork"} if devices > 1 else {}
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


@pytest.mark.parametrize("train", [True, False])
def test_every_rank_gets_the_same_batches_for_any_size_world_and_batch(train):
    """Any dataset size, world size and batch size: the same batch count on every rank (else DDP's next all-reduce
    waits forever); evaluation padding is marked IGNORE, so every image is counted exactly once across the ranks."""
    from vit.data.device import IGNORE, DeviceBatches

    for n in (1, 2, 5, 7, 100, 1001):
        for world in (1, 2, 3, 4, 8):
            for batch in (1, 3, 16, 167, 2000):
                images = torch.zeros(n, 1, 2, 2, dtype=torch.uint8)
                targets = torch.arange(n)
                ranks = [
                    DeviceBatches(images, targets, batch, [0.0], [1.0], train=train, rank=r, world_size=world)
                    for r in range(world)
                ]
                counts = [len(list(iter(b))) for b in ranks]
                assert len(set(counts)) == 1 and counts[0] == len(ranks[0]), (n, world, batch, counts)
                if not train:
                    seen = torch.cat([y for b in ranks for _, y in b])
                    assert sorted(seen[seen != IGNORE].tolist()) == list(range(n)), (n, world, batch)


def test_validation_over_two_ranks_equals_one_process_padding_never_counted(tmp_path):
    """361 validation digits, eval batch 50, 2 ranks: rank 1's share is padded by one image, which must not count."""
    results = {}
    for devices in (1, 2):
        # the same weights both times, each in a module of its own: forked ranks inherit the parent's objects, and an
        # already validated module's metric states are inference tensors
        L.seed_everything(0)
        module = ViTClassifier(**MODEL)
        trainer = L.Trainer(
            accelerator="cpu",
            devices=devices,
            strategy="ddp_fork" if devices > 1 else "auto",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
        )
        dm = DigitsDataModule(val_size=361, batch_size=32, eval_batch_size=50)
        results[devices] = trainer.validate(module, datamodule=dm, verbose=False)[0]
    assert results[2]["val/acc"] == pytest.approx(results[1]["val/acc"], abs=1e-7)
    assert results[2]["val/acc5"] == pytest.approx(results[1]["val/acc5"], abs=1e-7)
    assert results[2]["val/acc_balanced"] == pytest.approx(results[1]["val/acc_balanced"], abs=1e-6)
    assert results[2]["val/f1_macro"] == pytest.approx(results[1]["val/f1_macro"], abs=1e-6)


def test_two_rank_ddp_on_1001_images_at_batch_167_trains_two_epochs_and_exits(tmp_path):
    """Before padding, rank 0 had three training batches and rank 1 two: both waited in the all-reduce until killed.
    The command line with ddp_fork: the hang was in the batch counts, not the launcher, and forked ranks skip the two
    fresh interpreters that ddp_spawn imports torch in (17 s of this test against 6 s)."""
    import subprocess
    import sys
    from pathlib import Path

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", 1001), ("val", 101)):
        for i in range(n):
            c = f"c{i % 2}"
            (tmp_path / "imgs" / split / c).mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8)).save(
                tmp_path / "imgs" / split / c / f"{i}.png"
            )
    script = Path(__file__).parents[2] / "train.py"
    flags = [
        "--plan=false",
        "--data.init_args.img_size=8",
        "--data.init_args.batch_size=167",
        "--model.arch.patch_size=4",
    ]
    flags += ["--model.arch.embed_dim=16", "--model.arch.depth=1", "--model.arch.num_heads=1", "--trainer.max_epochs=2"]
    flags += ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp_fork"]
    flags += ["--trainer.enable_progress_bar=false", "--attention_maps.every_n_epochs=0"]
    flags += ["--find_label_issues=true"]  # under DDP it wrote nothing and said nothing
    run = subprocess.run(
        [sys.executable, str(script), "fit", "--data.root", str(tmp_path / "imgs"), *flags],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,  # it used to hang: fail instead of waiting forever
    )
    assert run.returncode == 0, run.stderr[-3000:]
    from vit.data.folder import default_memory_budget_gb

    shared = f"within max_memory_gb={round(default_memory_budget_gb() / 2, 2):.1f}"  # each rank holds its own copy
    assert shared in run.stdout + run.stderr, (run.stdout + run.stderr)[:2000]
    assert "best val/acc" in run.stdout and (tmp_path / "checkpoints" / "folder" / "version_0" / "last.ckpt").is_file()
    issues = (tmp_path / "logs" / "folder" / "version_0" / "label_issues.csv").read_text().splitlines()
    assert "label issues: " in run.stdout and len(issues) >= 1  # a header at least; rows for the suspicious files


class _HeadOnlyFirst(L.Callback):
    """Rank zero writes which parameters changed in each epoch."""

    def __init__(self, out):
        self.out = out

    def on_train_epoch_start(self, trainer, module):
        self.before = {k: v.detach().clone() for k, v in module.model.state_dict().items()}

    def on_train_epoch_end(self, trainer, module):
        if trainer.is_global_zero:
            after = module.model.state_dict()
            changed = sorted(k for k in after if not torch.equal(after[k], self.before[k]))
            (self.out / f"epoch{trainer.current_epoch}.txt").write_text("\n".join(changed))


def test_freeze_backbone_under_ddp_trains_the_head_then_everything(tmp_path):
    """requires_grad switched after DDP wrapped the model broke its gradient reduction; now the frozen epoch drops
    the backbone's gradients before the step instead."""
    module = ViTClassifier(**MODEL, freeze_backbone_epochs=1)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_fork",
        max_epochs=2,
        limit_train_batches=2,
        limit_val_batches=0,
        callbacks=[_HeadOnlyFirst(tmp_path)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, datamodule=DigitsDataModule(batch_size=16))
    assert (tmp_path / "epoch0.txt").read_text().split() == ["head.bias", "head.weight"]
    assert "blocks.0.attn.qkv.weight" in (tmp_path / "epoch1.txt").read_text().split()


def test_the_processes_a_trainer_config_runs_on_this_machine(monkeypatch):
    from vit.training.run import local_processes

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert local_processes({"devices": 2, "accelerator": "cpu"}) == 2
    assert local_processes({"devices": [0, 1, 2]}) == 3
    assert local_processes({"devices": "auto", "accelerator": "gpu"}) == 4
    assert local_processes({"devices": "auto", "accelerator": "cpu"}) == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert local_processes({"devices": 1}) == 8
