"""Post-hoc logit adjustment for long-tailed training sets (Menon et al., 2021, "Long-tail learning via logit
adjustment"): a model trained on a skewed prior predicts `argmax(logits - tau * log(prior))` to maximise balanced
accuracy. One scalar tau is chosen on the validation set (a grid, the best balanced accuracy, the smallest tau on a
tie) and kept only where the gain is beyond the validation set's noise: in at least 95% of 1,000 seeded bootstrap
resamples of the validation images, the adjusted balanced accuracy beats the unadjusted one (else tau 0). The kept
tau is folded into the head's bias, `b <- b - tau * log(prior)`, so that vit-predict, vit-serve, vit-eval and an
exported model all predict with it and nothing else has to know. The checkpoint records it under
`logit_adjustment` (`tau`, `tau_fit`, `bootstrap_wins`, `prior`, `balanced_accuracy`, `balanced_accuracy_before`).

Why the gate: on a few hundred validation images the grid's argmax is noisy; on a 2:1 folder of that size it chose
taus from 0 to 1.6 across runs of one fold and cost several points of held-out accuracy for a fraction of a point of
balanced accuracy. The rule, its five rivals and the sets it was chosen on: docs/recipes.md, "Choosing the post-hoc
tau".
"""

import torch

from vit.evaluation.scores import balanced_accuracy

TAUS = tuple(round(0.1 * i, 1) for i in range(21))  # 0, 0.1, ..., 2.0
BOOTSTRAPS = 1000  # seeded resamples of the validation images
GATE = 0.95  # the share of them in which the fitted tau must beat tau 0 to be kept


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


def resampled_balanced_accuracy(pred: torch.Tensor, targets: torch.Tensor, idx: torch.Tensor, num_classes: int):
    """(B,) balanced accuracy of each resample `idx` (B, N) of the images (pred, targets: (N,)), vectorised: one
    bincount of (resample, class) keys instead of B confusion matrices."""
    b = idx.shape[0]
    y = targets[idx]  # (B, N)
    key = (torch.arange(b)[:, None] * num_classes + y).flatten()  # (B * N,)
    support = torch.bincount(key, minlength=b * num_classes).view(b, num_classes).double()
    hits = (pred[idx] == y).flatten().double()
    correct = torch.bincount(key, weights=hits, minlength=b * num_classes).view(b, num_classes)
    present = support > 0  # recall over the classes the resample has, as balanced_accuracy does
    return (correct / support.clamp(min=1)).where(present, 0.0).sum(1) / present.sum(1)


def bootstrap_wins(base: torch.Tensor, adjusted: torch.Tensor, targets: torch.Tensor, num_classes: int) -> float:
    """The share of BOOTSTRAPS paired resamples of the images (seed 0; the same images for both) in which the adjusted
    predictions' balanced accuracy is above the base ones' (a tie is not a win). base, adjusted, targets: (N,)."""
    g, n, wins = torch.Generator().manual_seed(0), len(targets), 0
    chunk = max(1, min(BOOTSTRAPS, 2**22 // max(n, 1)))  # resamples a pass: (chunk, N) int64 indices stay ~32 MB
    for start in range(0, BOOTSTRAPS, chunk):
        idx = torch.randint(n, (min(chunk, BOOTSTRAPS - start), n), generator=g)
        before = resampled_balanced_accuracy(base, targets, idx, num_classes)
        after = resampled_balanced_accuracy(adjusted, targets, idx, num_classes)
        wins += int((after > before + 1e-12).sum())
    return wins / BOOTSTRAPS


def choose_tau(logits: torch.Tensor, targets: torch.Tensor, prior: torch.Tensor) -> dict:
    """The grid's tau (fit_tau), kept where it wins in GATE of the bootstrap resamples, else 0: {"tau", "tau_fit",
    "bootstrap_wins", "balanced_accuracy" (with the kept tau), "balanced_accuracy_before"} on these logits."""
    num_classes = logits.shape[-1]
    base = logits.argmax(-1)
    before = balanced_accuracy(base, targets, num_classes)
    tau_fit, best = fit_tau(logits, targets, prior)
    wins = bootstrap_wins(base, (logits - tau_fit * prior).argmax(-1), targets, num_classes) if tau_fit else 0.0
    kept = wins >= GATE
    return {
        "tau": tau_fit if kept else 0.0,
        "tau_fit": tau_fit,
        "bootstrap_wins": wins,
        "balanced_accuracy": best if kept else before,
        "balanced_accuracy_before": before,
    }


def adjust_checkpoints(paths: list[str], batches, counts: list[int], device: torch.device) -> dict[str, dict]:
    """Choose tau on `batches` (the validation set) for each checkpoint and fold it into the head's bias, in the file
    (rewritten atomically). Returns {path: choose_tau's report}."""
    from vit.evaluation.calibration import logits_of
    from vit.model.checkpoint import load_checkpoint, load_model
    from vit.training.checkpoint_io import AtomicCheckpointIO

    prior = log_prior(counts)
    reports = {}
    for path in dict.fromkeys(paths):
        model, _ = load_model(path)
        logits, targets = logits_of(model, batches, device)
        report = choose_tau(logits, targets, prior)
        ckpt = load_checkpoint(path)
        sd = ckpt["state_dict"]
        for key in ("model.head.bias", "model.head_dist.bias"):  # both heads of a distilled model: their mean moves
            if key in sd:
                sd[key] = sd[key] - (report["tau"] * prior).to(sd[key].dtype)
        ckpt["logit_adjustment"] = {**report, "prior": prior.exp().tolist()}
        AtomicCheckpointIO().save_checkpoint(ckpt, path)
        reports[path] = report
    return reports
