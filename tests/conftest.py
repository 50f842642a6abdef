import os

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
os.environ.setdefault("PYTHONHASHSEED", "0")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
