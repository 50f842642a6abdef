import gc
import os
from types import SimpleNamespace

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
os.environ.setdefault("PYTHONHASHSEED", "0")
# One precision on every machine: oneDNN held to AVX2 has no bf16 arithmetic, so `precision: auto` is fp32 without
# timing bf16 (vit/planning/speed.py native_bf16_cpu). On a CPU with native bf16 the timing cost 67 s of the suite's
# work (the EPYC with AVX512-BF16), and runs trained in bf16 there and in fp32 elsewhere. The rule's own tests mock the
# flags (tests/planning/test_precision.py). The commands the tests start inherit it.
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")
if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs two workers on two cores: one thread each, or they thrash
    os.environ["OMP_NUM_THREADS"] = "1"  # the commands the tests start inherit it
    torch.set_num_threads(1)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Files holding the longest tests outside the xdist groups, run first: pytest-xdist hands the ungrouped tests out in
# collection order (after the groups), so a long test collected last keeps one worker busy while the other has nothing
# left (test_pretrained_cnn's 15 s handed out last: the two workers end 9 s apart; docs/testing.md).
LONGEST_FIRST = (
    "planning/test_hybrid_plan.py",
    "training/test_pretrained_cnn.py",
    "training/test_distributed.py",
    "training/test_teacher.py",
    "test_train.py",
    "test_fuzz.py",
)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups into the test ids
def pytest_collection_modifyitems(items):
    """LONGEST_FIRST's files before the rest, each file's tests in their order (module fixtures are built once); the
    tests that read `smoke_onnx` join the serve group, whose int8 test reads it too: one export a session, not one on
    each worker."""
    first = {os.path.join(ROOT, "tests", name) for name in LONGEST_FIRST}
    items.sort(key=lambda item: str(item.path) not in first)  # stable: the order within each part is kept
    for item in items:
        if "smoke_onnx" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("serve"))


def pytest_collection_finish(session):
    """The modules imported so far live for the whole session: gc.freeze() moves them out of the collector's view, so
    its full collections scan what the tests create. The two workers spent 6.1 and 5.5 s in full collections without
    it, 5.2 and 3.9 s with it (timed by a gc.callbacks hook, Xeon)."""
    gc.freeze()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def fit_in(root, args: list[str]):
    """train.main(args) with `root` as the working folder (logs/ and checkpoints/ go there); for module fixtures,
    where monkeypatch.chdir is not available."""
    import train

    cwd = os.getcwd()
    os.chdir(root)
    try:
        return train.main(args)
    finally:
        os.chdir(cwd)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run in an empty folder, so logs/ and checkpoints/ of a test never touch the repository."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


SMOKE = os.path.join(ROOT, "configs", "smoke.yaml")


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """One smoke fit for the whole session (configs/smoke.yaml: 2 epochs of 4 digit batches, attention maps every
    epoch): `.root`, the folder it ran in (checkpoints/smoke/version_0/, logs/smoke/version_0/), and `.cli`, the
    LightningCLI. Read them, never write into them: tests that change a run train their own."""
    root = tmp_path_factory.mktemp("smoke_run")
    cli = fit_in(root, ["fit", "--config", SMOKE, "--trainer.enable_progress_bar", "false"])
    return SimpleNamespace(root=root, cli=cli)


@pytest.fixture(scope="session")
def smoke_ckpt(smoke_run):
    """last.ckpt of the shared smoke run."""
    return smoke_run.root / "checkpoints" / "smoke" / "version_0" / "last.ckpt"


@pytest.fixture(scope="session")
def smoke_onnx(smoke_ckpt, tmp_path_factory):
    """`vit-export --format onnx` of the shared smoke run's last.ckpt, once a session (an export takes 2-3 s; three
    tests read it): the model's path, its sidecar beside it (`m.onnx.json`). Read it, never write into its folder."""
    from vit.commands.export import main

    out = tmp_path_factory.mktemp("smoke_onnx") / "m.onnx"
    assert main(["--ckpt", str(smoke_ckpt), "--format", "onnx", "--out", str(out)]) == 0
    return out
