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


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run in an empty folder, so logs/ and checkpoints/ of a test never touch the repository."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
