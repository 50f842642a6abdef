"""vit/evaluation/calibration.py: the fitted temperature minimises the NLL, leaves the argmax alone, and lowers the ECE
of an over-confident model on held-out logits."""

import torch
import torch.nn.functional as F

from vit.evaluation.calibration import calibration_report, fit_temperature, probabilities


def _overconfident(n: int, seed: int):
    """Logits of a model that is right ~70% of the time but says ~99%: true logits sharpened by 4."""
    g = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, 5, (n,), generator=g)
    clean = torch.randn(n, 5, generator=g)
    clean[torch.arange(n), targets] += 1.2
    return clean * 4.0, targets


def test_the_temperature_minimises_nll_and_keeps_every_top1():
    logits, targets = _overconfident(2000, 0)
    t = fit_temperature(logits, targets)
    assert 2.5 < t < 6.0  # the sharpening was 4
    nll = lambda temp: F.cross_entropy(logits / temp, targets).item()  # noqa: E731
    assert nll(t) <= min(nll(t * 0.9), nll(t * 1.1), nll(1.0))
    assert torch.equal(probabilities(logits, t).argmax(-1), logits.argmax(-1))


def test_on_held_out_logits_the_ece_falls():
    fit_logits, fit_targets = _overconfident(2000, 1)
    held_logits, held_targets = _overconfident(2000, 2)  # not used to fit
    report = calibration_report(held_logits, held_targets, fit_temperature(fit_logits, fit_targets))
    assert report["ece"] < report["ece_uncalibrated"] / 3 and report["nll"] < report["nll_uncalibrated"]


def test_a_calibrated_model_keeps_a_temperature_near_one():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4000, 4, generator=g)
    targets = torch.multinomial(logits.softmax(-1), 1, generator=g).squeeze(1)  # labels drawn from its own softmax
    assert abs(fit_temperature(logits, targets) - 1.0) < 0.1


def test_a_model_at_chance_is_calibrated_towards_uniform_within_the_range(tmp_path):
    """Random labels: the NLL keeps falling as T grows; the fit stops at the top of the range, which loads."""
    from vit.evaluation.calibration import TEMPERATURE_RANGE

    g = torch.Generator().manual_seed(5)
    logits, targets = torch.randn(500, 10, generator=g) * 3, torch.randint(0, 10, (500,), generator=g)
    t = fit_temperature(logits, targets)
    assert t == TEMPERATURE_RANGE[1]
    from vit.model.checkpoint import temperature_of

    assert temperature_of({"calibration": {"temperature": t}}, tmp_path / "x.ckpt") == t
