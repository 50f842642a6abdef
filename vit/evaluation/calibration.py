"""Calibrated probabilities: temperature scaling (Guo et al., 2017) fitted after training, and how well it worked.

A model trained with label smoothing, Mixup or for many epochs gives softmax probabilities that are not frequencies:
its "0.93" is right more or less often than 93% of the time. One scalar T, fitted on held-out logits by minimising the
negative log-likelihood, divides every logit: `softmax(logits / T)`. The argmax, and so every top-1, is unchanged.
`vit-train fit` fits T on the validation set at the end (vit/commands/train.py) and stores it in the checkpoints;
vit-predict and vit-serve apply it (`--raw-probs`, `?raw=1`: the softmax as it was), and the ONNX sidecar carries it.

ECE here is the top-1 ECE of vit/evaluation/scores.py (15 equal-width confidence bins, L1): the gap between
confidence and accuracy, weighted by how many predictions fall in each bin.
"""

import math

import torch
import torch.nn.functional as F

from vit.evaluation.scores import top1_ece

# A model no better than chance is best calibrated by uniform probabilities: its NLL falls as T grows without end.
# softmax(logits / 100) is uniform to within any digit anyone reads, so the fit stops there (and at 1/100 below).
TEMPERATURE_RANGE = (0.01, 100.0)


def fit_temperature(logits: torch.Tensor, targets: torch.Tensor, max_iter: int = 100) -> float:
    """T > 0 minimising NLL(softmax(logits / T), targets): LBFGS on log T (T stays positive), from T = 1, kept
    within TEMPERATURE_RANGE."""
    logits, targets = logits.detach().float().cpu(), targets.detach().cpu()
    log_t = torch.zeros((), requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=0.5, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(logits / log_t.exp(), targets)
        loss.backward()
        return loss

    opt.step(closure)
    t = float(log_t.detach().exp())
    low, high = TEMPERATURE_RANGE
    return min(high, max(low, t)) if math.isfinite(t) else high


def calibration_report(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> dict:
    """ECE and NLL with and without the temperature: {"temperature", "ece", "ece_uncalibrated", "nll",
    "nll_uncalibrated"} as floats."""
    logits, targets = logits.detach().float().cpu(), targets.detach().cpu()

    def ece(scaled: torch.Tensor) -> float:
        confidence, pred = scaled.softmax(-1).max(-1)
        return top1_ece(confidence, pred == targets)

    return {
        "temperature": temperature,
        "ece": ece(logits / temperature),
        "ece_uncalibrated": ece(logits),
        "nll": float(F.cross_entropy(logits / temperature, targets)),
        "nll_uncalibrated": float(F.cross_entropy(logits, targets)),
    }


def probabilities(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The probabilities the toolkit serves: softmax(logits / T) (T = 1: the raw softmax)."""
    return (logits.float() / temperature).softmax(-1)


@torch.no_grad()
def logits_of(model: torch.nn.Module, batches, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, C) logits and (N,) targets of a model over (images, targets) batches, on the CPU."""
    model = model.to(device).eval()
    out, ys = [], []
    for x, y in batches:
        out.append(model(x.to(device)).float().cpu())
        ys.append(y.cpu())
    return torch.cat(out), torch.cat(ys)
