"""vit/training/metrics.py: accuracy and confusion counts on the device, equal to the references, padding never
counted."""

import pytest
import torch
from sklearn.metrics import balanced_accuracy_score, f1_score

from vit.data.device import IGNORE
from vit.training.metrics import ConfusionCounts, TopKAccuracy


def _batch(seed: int, n: int = 40, classes: int = 6):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, classes, generator=g)
    target = torch.randint(0, classes - 1, (n,), generator=g)  # the last class never occurs as a target
    return logits, target


def test_balanced_accuracy_and_macro_f1_equal_scikit_learns_with_padding_left_out():
    metric = ConfusionCounts(6)
    ys, preds = [], []
    for seed in range(3):
        logits, target = _batch(seed)
        padded = torch.cat([target, torch.full((5,), IGNORE)])  # DDP padding: never counted
        metric.update(torch.cat([logits, torch.randn(5, 6)]), padded)
        ys.append(target)
        preds.append(logits.argmax(-1))
    y, p = torch.cat(ys).numpy(), torch.cat(preds).numpy()
    balanced, f1 = metric.compute()
    assert balanced.item() == pytest.approx(balanced_accuracy_score(y, p), abs=1e-6)
    assert f1.item() == pytest.approx(f1_score(y, p, average="macro", zero_division=0), abs=1e-6)
    assert int(metric.matrix().sum()) == len(y)


def test_top_k_accuracy_counts_only_real_targets():
    logits, target = _batch(4)
    metric = TopKAccuracy(2)
    metric.update(logits, torch.cat([target[:-3], torch.full((3,), IGNORE)]))
    real = target[:-3]
    expected = (logits[:-3].topk(2, dim=-1).indices == real[:, None]).any(-1).float().mean()
    torch.testing.assert_close(metric.compute(), expected)


def test_a_fit_logs_balanced_accuracy_and_macro_f1(smoke_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(smoke_run.root / "logs" / "smoke" / "version_0"), size_guidance={"scalars": 0})
    ea.Reload()
    for tag in ("val/acc_balanced", "val/f1_macro"):
        values = [e.value for e in ea.Scalars(tag)]
        assert len(values) == 2 and all(0.0 <= v <= 1.0 for v in values), (tag, values)
