"""Post-hoc logit adjustment for long-tailed training sets (Menon et al., 2021, "Long-tail learning via logit
adjustment"): a model trained on a skewed prior predicts `argmax(logits - tau * log(prior))` to maximise balanced
accuracy. One scalar tau is chosen on the validation set (a grid, the best balanced accuracy, the smallest tau on a
tie) and folded into the head's bias, `b <- b - tau * log(prior)`, so that vit-predict, vit-serve, vit-eval and an
exported model all predict with it and nothing else has to know. The checkpoint records it under
`logit_adjustment` (`tau`, `prior`, `balanced_accuracy`, `balanced_accuracy_before`).
"""

import torch

from vit.evaluation.scores import balanced_accuracy

TAUS = tuple(round(0.1 * i, 1) for i in range(21))  # 0, 0.1, ..., 2.0


def log_prior(counts: list[int]) -> torch.Tensor:
    """(C,) log of the training set's class shares (a class without images counts as one)."""
    c = torch.tensor(counts, dtype=torch.float64).clamp(min=1)
    return (c / c.sum()).log().float()


def fit_tau(logits: torch.Tensor, targets: torch.Tensor, prior: torch.Tensor) -> tuple[float, float]:
    """(tau, balanced accuracy) of the grid's best `logits - tau * prior` (prior: log shares)."""
    num_classes = logits.shape[-1]
    best = (TAUS[0], balanced_accuracy(logits.argmax(-1), targets, num_classes))
    for tau in TAUS[1:]:
        acc = balanced_accuracy((logits - tau * prior).argmax(-1), targets, num_classes)
        if acc > best[1] + 1e-12:
            best = (tau, acc)
    return best


def adjust_checkpoints(paths: list[str], batches, counts: list[int], device: torch.device) -> dict[str, dict]:
    """Fit tau on `batches` (the validation set) for each checkpoint and fold it into the head's bias, in the file
    (rewritten atomically). Returns {path: {"tau", "balanced_accuracy", "balanced_accuracy_before"}}."""
    from vit.evaluation.calibration import logits_of
    from vit.model.checkpoint import load_checkpoint, load_model
    from vit.training.checkpoint_io import AtomicCheckpointIO

    prior = log_prior(counts)
    reports = {}
    for path in dict.fromkeys(paths):
        model, _ = load_model(path)
        logits, targets = logits_of(model, batches, device)
        before = balanced_accuracy(logits.argmax(-1), targets, logits.shape[-1])
        tau, after = fit_tau(logits, targets, prior)
        ckpt = load_checkpoint(path)
        bias = ckpt["state_dict"]["model.head.bias"]
        ckpt["state_dict"]["model.head.bias"] = bias - (tau * prior).to(bias.dtype)
        report = {"tau": tau, "balanced_accuracy": after, "balanced_accuracy_before": before}
        ckpt["logit_adjustment"] = {**report, "prior": prior.exp().tolist()}
        AtomicCheckpointIO().save_checkpoint(ckpt, path)
        reports[path] = report
    return reports
