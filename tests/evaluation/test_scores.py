"""vit/evaluation/scores.py: balanced accuracy off the hot path equals scikit-learn's and the device metric's."""

import pytest
import torch
from sklearn.metrics import balanced_accuracy_score

from vit.evaluation.scores import balanced_accuracy
from vit.training.metrics import ConfusionCounts


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_balanced_accuracy_equals_sklearn_and_the_device_metric(seed):
    g = torch.Generator().manual_seed(seed)
    true = torch.randint(0, 5, (200,), generator=g)
    true[true == 4] = 3  # class 4 has no image (only predictions): left out of the mean, as scikit-learn does
    logits = torch.randn(200, 5, generator=g) + 2.0 * torch.nn.functional.one_hot(true, 5) * (seed + 1) / 3
    pred = logits.argmax(-1)
    assert (pred == 4).any()
    expected = balanced_accuracy_score(true.numpy(), pred.numpy())
    assert balanced_accuracy(pred, true, 5) == pytest.approx(expected, abs=1e-12)
    device = ConfusionCounts(5)
    device.update(logits, true)
    assert float(device.compute()[0]) == pytest.approx(expected, abs=1e-6)


def test_top1_ece_is_torchmetrics_multiclass_ece_of_the_softmax():
    from torchmetrics.functional.classification import multiclass_calibration_error

    from vit.evaluation.scores import ECE_BINS, top1_ece

    g = torch.Generator().manual_seed(0)
    logits, true = torch.randn(300, 6, generator=g) * 3, torch.randint(0, 6, (300,), generator=g)
    probs = logits.softmax(-1)
    confidence, pred = probs.max(-1)
    expected = float(multiclass_calibration_error(probs, true, 6, n_bins=ECE_BINS))
    assert top1_ece(confidence, pred == true) == pytest.approx(expected, abs=1e-6) and expected > 0.05
