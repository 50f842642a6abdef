"""Crash and resume: SIGKILL a forked training process mid-epoch and mid-checkpoint-write, resume, and end with the
weights and the validation accuracy of an uninterrupted run (deterministic CPU)."""

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from conftest import fit_in
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import train
from vit.model.checkpoint import load_checkpoint

# one worker runs this file under `make test` (--dist loadgroup): its module fixture is built once, not per worker
pytestmark = pytest.mark.xdist_group("resume")

ROOT = Path(__file__).parents[2]
ARGS = [
    "fit",
    "--config",
    str(ROOT / "configs" / "smoke.yaml"),
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.max_epochs",
    "3",
    "--trainer.limit_train_batches",
    "10",
    "--checkpoint_every_n_steps",
    "3",
    "--trainer.deterministic",
    "true",
    "--model.arch.drop_path_rate",
    "0.2",
    "--model.mixup_alpha",
    "0.5",
    "--attention_maps.every_n_epochs",
    "100",
]
CKPTS = Path("checkpoints", "smoke", "version_0")


def _child(root: str, pause_in_write: int) -> None:
    """The real train.main in a forked copy of this process (a fresh interpreter spent ~5 s importing), slowed to
    ~0.15 s a step so that the parent can kill it at a chosen moment. pause_in_write: the Nth checkpoint write hangs
    after the data, before the rename, and says which file in root/IN_WRITE."""
    import vit.training.checkpoint_io as io
    import vit.training.module as vm

    os.chdir(root)
    step = vm.ViTClassifier.training_step
    vm.ViTClassifier.training_step = lambda self, b, i: (time.sleep(0.15), step(self, b, i))[1]
    if pause_in_write:
        replace, calls = io.os.replace, [0]

        def slow_replace(src, dst):
            calls[0] += 1
            if calls[0] == pause_in_write:
                Path(root, "IN_WRITE").write_text(str(dst))
                time.sleep(60)
            replace(src, dst)

        io.os.replace = slow_replace
    train.main(ARGS)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One torch thread for the run, its forked child and the resume: a child forked from a process whose OpenMP pool
    ran two threads hung at its first parallel op (GNU libgomp is not fork-safe), and one thread count for all three
    keeps them bit-comparable."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    root = tmp_path_factory.mktemp("full")
    fit_in(root, ARGS)
    return root


def _final(root: Path):
    ckpt = load_checkpoint(root / CKPTS / "last.ckpt")
    ea = EventAccumulator(str(root / "logs" / "smoke" / "version_0"))
    ea.Reload()
    return ckpt, [e.value for e in ea.Scalars("val/acc")]


def _start(tmp_path: Path, pause_in_write: int = 0) -> multiprocessing.Process:
    child = multiprocessing.get_context("fork").Process(target=_child, args=(str(tmp_path), pause_in_write))
    child.start()
    return child


def _kill(child: multiprocessing.Process) -> None:
    child.kill()
    child.join(timeout=30)
    assert child.exitcode == -signal.SIGKILL


def _resume_and_compare(tmp_path: Path, uninterrupted: Path) -> None:
    fit_in(tmp_path, [*ARGS, "--ckpt_path", "last"])
    ours, ours_acc = _final(tmp_path)
    ref, ref_acc = _final(uninterrupted)
    assert ours["global_step"] == ref["global_step"] == 30
    for k, v in ref["state_dict"].items():
        torch.testing.assert_close(ours["state_dict"][k], v, atol=1e-6, rtol=0, msg=k)
    assert ours_acc[-1] == pytest.approx(ref_acc[-1], abs=1e-6)


def test_killed_during_an_epoch_resumes_to_the_same_weights(tmp_path, uninterrupted):
    child = _start(tmp_path)
    step_ckpt = tmp_path / CKPTS / "last-step.ckpt"
    deadline, seen = time.monotonic() + 120, set()
    while time.monotonic() < deadline and len(seen) < 4:  # a few step checkpoints: we are in epoch 1
        if step_ckpt.exists():
            seen.add(step_ckpt.stat().st_mtime_ns)
        time.sleep(0.02)
    time.sleep(0.2)  # somewhere between two checkpoints
    _kill(child)
    assert len(seen) >= 4
    step = load_checkpoint(step_ckpt)["global_step"]
    assert 10 < step < 30  # a checkpoint from the middle of the run, mid-epoch
    _resume_and_compare(tmp_path, uninterrupted)


def test_killed_during_a_checkpoint_write_keeps_the_old_checkpoint_and_resumes(tmp_path, uninterrupted):
    child = _start(tmp_path, pause_in_write=8)
    said = tmp_path / "IN_WRITE"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (said.exists() and said.read_text()):
        time.sleep(0.02)
    target = Path(said.read_text())
    before = load_checkpoint(target)["global_step"]  # the previous version is whole and readable
    _kill(child)
    after = load_checkpoint(target)
    assert after["global_step"] == before
    assert list(target.parent.glob(f".{target.name}.*.tmp"))  # the half-written file never replaced it
    _resume_and_compare(tmp_path, uninterrupted)


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):  # unpickling this would create the marker file
        return (Path.touch, (Path(self.marker),))


@pytest.mark.parametrize("case", ["missing", "truncated", "pickle_payload"])
def test_resume_from_a_bad_checkpoint_is_one_line(case, tmp_path, uninterrupted, monkeypatch):
    bad, marker = tmp_path / "bad.ckpt", tmp_path / "PWNED"
    if case == "truncated":
        bad.write_bytes((uninterrupted / CKPTS / "last.ckpt").read_bytes()[:3000])
    elif case == "pickle_payload":
        data = load_checkpoint(uninterrupted / CKPTS / "last.ckpt")
        data["hyper_parameters"]["payload"] = _Payload(marker)
        torch.save(data, bad)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        train.main([*ARGS, "--ckpt_path", str(bad)])
    message = str(e.value)
    assert message.startswith("error: ") and str(bad) in message and "\n" not in message
    assert not marker.exists()


@pytest.mark.parametrize("on_device", [True, False], ids=["found_inf", "host-check"])
@pytest.mark.parametrize("skip", [False, True])
def test_a_non_finite_loss_stops_naming_the_step_or_is_skipped(skip, on_device, tmp_path, monkeypatch):
    import vit.training.module as vm

    forward = vm.ViTClassifier.forward

    def poisoned(self, x):  # NaN logits at global step 5 only
        out = forward(self, x)
        return out * float("nan") if self.training and self.global_step == 5 else out

    monkeypatch.setattr(vm.ViTClassifier, "forward", poisoned)
    if not on_device:  # as with an optimizer that has no fused kernel reading found_inf
        monkeypatch.setattr(vm, "supports_found_inf", lambda optimizer: False)
    monkeypatch.chdir(tmp_path)
    args = [*ARGS, "--model.skip_nonfinite", str(skip).lower(), "--trainer.max_epochs", "1"]
    if skip:
        cli = train.main(args)
        assert cli.model._guard_on_device is on_device
        assert cli.trainer.callback_metrics["train/skipped_nonfinite"].item() == 1.0
        assert torch.isfinite(torch.cat([p.flatten() for p in cli.model.parameters()])).all()
        # the skipped update left AdamW's state as if the step had not happened: one step fewer than the trainer's
        steps = {int(s["step"]) for s in cli.trainer.optimizers[0].state.values()}
        assert steps == {cli.trainer.global_step - 1}
    else:
        with pytest.raises(SystemExit) as e:
            train.main(args)
        assert str(e.value).startswith("error: non-finite loss (nan) at step 5 (epoch 0, batch 5)")
        assert e.value.code == str(e.value)  # a run that failed, not a usage error: sys.exit(message), status 1
        assert load_checkpoint(tmp_path / CKPTS / "last-step.ckpt")["global_step"] == 3  # intact, before the NaN


def test_the_cuda_generator_is_saved_and_restored_for_an_exact_resume(monkeypatch):
    """On a GPU dropout, DropPath and PatchDropout draw from the CUDA generator: it travels in the checkpoint too.
    (No GPU here: torch.cuda's RNG calls are stood in for, and only the module's handling of them is checked.)"""
    from vit.model.config import ViTConfig
    from vit.training.module import ViTClassifier

    states = [torch.arange(4, dtype=torch.uint8)]
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [s.clone() for s in states])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda s: restored.append(s))
    module = ViTClassifier(arch=ViTConfig(embed_dim=16, depth=1, num_heads=1, patch_size=8))
    ckpt = {}
    module.on_save_checkpoint(ckpt)
    assert torch.equal(ckpt["rng_states"]["cuda"][0], states[0])
    module.on_load_checkpoint(ckpt)  # applied at the start of training
    monkeypatch.setattr(
        type(module),
        "optimizers",
        lambda self, use_pl_optimizer=False: torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1),
    )
    monkeypatch.setattr(type(module), "trainer", property(lambda self: type("T", (), {"train_dataloader": None})()))
    module.on_train_start()
    assert len(restored) == 1 and torch.equal(restored[0][0], states[0])


def test_resume_last_looks_where_the_run_wrote_under_default_root_dir(tmp_path):
    """`--trainer.default_root_dir D` writes D/checkpoints/<run>/version_<n>/; `--ckpt_path last` finds them there
    (it looked under ./checkpoints/ and stopped with 'no last*.ckpt')."""
    quick = ["fit", "--config", str(ROOT / "configs" / "smoke.yaml"), "--trainer.enable_progress_bar", "false"]
    quick += ["--trainer.default_root_dir", "runs", "--attention_maps.every_n_epochs", "100"]
    fit_in(tmp_path, [*quick, "--trainer.max_epochs", "1"])
    last = tmp_path / "runs" / "checkpoints" / "smoke" / "version_0" / "last.ckpt"
    assert last.is_file() and not (tmp_path / "checkpoints").exists()
    cli = fit_in(tmp_path, [*quick, "--trainer.max_epochs", "2", "--ckpt_path", "last"])
    assert (tmp_path / cli.trainer.ckpt_path).resolve() == last.resolve() and cli.trainer.current_epoch == 2
