"""Rules for the post-hoc logit adjustment's tau, each chosen on a run's validation images and scored on its held-out
folder: the evidence behind the rule in vit/evaluation/logit_adjustment.py (docs/recipes.md, "The post-hoc tau").

    python bench/experiments/tau_rules.py RUN/log.txt:TEST [RUN2/log.txt:TEST2 ...] > rules.jsonl

RUN/log.txt is the log budget_runs.py keeps (its last `checkpoint:` line names the chosen checkpoint). The checkpoint's
folded tau is unfolded first (raw = served + tau * log prior, from its `logit_adjustment` record), so every
rule starts from the same raw logits. Validation images are the checkpoint's own validation split (vit-eval --split
val), held-out images TEST/<class>/<image>. Prints one JSON row a run and rule: {"log", "rule", "tau", "val_gain",
"test": [acc, balanced]} (percent).

The rules, each a function of the validation logits (N, C), targets (N,) and the training set's log prior (C,):
- none: tau 0.
- grid: the grid's best validation balanced accuracy, the smallest tau on a tie (the rule until now).
- one: tau 1, Menon et al.'s choice for a calibrated model.
- calibrated: tau = T, the validation temperature: tau 1 on the calibrated logits z / T, i.e. the Bayes rule for
  balanced error when softmax(z / T) is the calibrated posterior under the training prior.
- balanced_nll: the grid's tau with the lowest class-balanced NLL, a temperature fitted for each tau (a smooth
  criterion where balanced accuracy on a few hundred images is a step function).
- gated: grid's tau where a paired bootstrap of the validation images (1,000 resamples) finds its balanced accuracy
  above tau 0's in at least 95% of them, else 0 (the product's rule since: logit_adjustment.choose_tau).
- gated99: the same with 99%.
- gated_cap1: the gated grid over 0-1 only (Menon et al.'s tau 1 for a calibrated model as the most).
- gated_acc: the gated tau, kept only where on the validation images the mean of accuracy and balanced accuracy
  with it is not below tau 0's (it may not cost more accuracy than it gains in balanced accuracy).
- oob: the grid's tau where, in at least 95% of 1,000 seeded bootstrap resamples, the tau the grid fits on the
  resample (in-bag) beats tau 0 on the images the resample left out (out-of-bag): a gate that includes the tau's
  selection, which `gated` does not (it tests the full set's argmax on resamples of the same images).

How the rule is chosen (fixed before any set was scored): on sets other than the cells, each run's held-out accuracy
and balanced accuracy averaged, then averaged over runs and sets; the highest such mean wins among the rules whose
mean held-out balanced accuracy is not below tau 0's (the adjustment is for balanced accuracy). The cells are scored
only after the choice, as a check. (The gated rule first ran its own bootstrap loop; it now calls the product's
choose_tau, which chose the same tau on every run of both.)
"""

import json

import torch
import torch.nn.functional as F
from tau_heldout import labelled_files, logits_of, runs  # same folder: run as a script

from vit.deployment.labelled import training_data
from vit.evaluation.calibration import fit_temperature
from vit.evaluation.logit_adjustment import (
    BOOTSTRAPS,
    GATE,
    TAUS,
    bootstrap_wins,
    choose_tau,
    fit_tau,
    resampled_balanced_accuracy,
)
from vit.evaluation.scores import balanced_accuracy
from vit.model.checkpoint import load_checkpoint


def balanced_nll(logits: torch.Tensor, targets: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Mean over the classes present of each class's mean NLL: the NLL a balanced prior would give."""
    nll = F.cross_entropy(logits, targets, reduction="none")
    per_class = torch.zeros(num_classes).index_add(0, targets, nll)
    counts = torch.bincount(targets, minlength=num_classes).float()
    present = counts > 0
    return (per_class[present] / counts[present]).mean()


def fitted_balanced_nll(logits: torch.Tensor, y: torch.Tensor) -> float:
    """The balanced NLL of logits / T at the T > 0 that minimises it (LBFGS on log T, from T = 1)."""
    log_t = torch.zeros((), requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=0.5, max_iter=50, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = balanced_nll(logits / log_t.exp(), y, logits.shape[-1])
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return float(balanced_nll(logits / log_t.exp(), y, logits.shape[-1]))


def tau_balanced_nll(z: torch.Tensor, y: torch.Tensor, lp: torch.Tensor) -> float:
    return min((fitted_balanced_nll(z - tau * lp, y), tau) for tau in TAUS)[1]


def out_of_bag_balanced_accuracy(pred: torch.Tensor, y: torch.Tensor, out: torch.Tensor, num_classes: int):
    """(B,) balanced accuracy of pred (B, N) over the images each row's mask `out` (B, N) keeps (y: (N,))."""
    b = pred.shape[0]
    key = (torch.arange(b)[:, None] * num_classes + y[None, :]).flatten()  # (B * N,)
    support = torch.bincount(key, weights=out.flatten().double(), minlength=b * num_classes).view(b, num_classes)
    hits = (out & (pred == y[None, :])).flatten().double()
    correct = torch.bincount(key, weights=hits, minlength=b * num_classes).view(b, num_classes)
    present = support > 0
    return (correct / support.clamp(min=1)).where(present, 0.0).sum(1) / present.sum(1)


def oob_wins(z: torch.Tensor, y: torch.Tensor, lp: torch.Tensor) -> float:
    """The share of BOOTSTRAPS resamples (seed 0) in which the grid's tau fitted on the resample beats tau 0 on the
    images the resample left out (a tie is not a win)."""
    c, n = z.shape[-1], len(y)
    preds = torch.stack([(z - tau * lp).argmax(-1) for tau in TAUS])  # (T, N)
    g, wins = torch.Generator().manual_seed(0), 0
    chunk = max(1, min(BOOTSTRAPS, 2**22 // max(n, 1)))
    for start in range(0, BOOTSTRAPS, chunk):
        idx = torch.randint(n, (min(chunk, BOOTSTRAPS - start), n), generator=g)  # (B, N)
        in_bag = torch.stack([resampled_balanced_accuracy(p, y, idx, c) for p in preds])  # (T, B)
        first_best = (in_bag >= in_bag.max(0).values - 1e-12).float().argmax(0)  # (B,) the smallest tau on a tie
        out = torch.zeros(idx.shape, dtype=torch.long).scatter_add_(1, idx, torch.ones_like(idx)) == 0  # (B, N)
        after = out_of_bag_balanced_accuracy(preds[first_best], y, out, c)
        before = out_of_bag_balanced_accuracy(preds[0].expand_as(out), y, out, c)
        wins += int((after > before + 1e-12).sum())
    return wins / BOOTSTRAPS


def gated_at(share: float, wins_of):
    """A rule: the grid's tau where wins_of(z, y, lp, tau) >= share, else 0."""

    def rule(z: torch.Tensor, y: torch.Tensor, lp: torch.Tensor) -> float:
        tau = fit_tau(z, y, lp)[0]
        return tau if tau and wins_of(z, y, lp, tau) >= share else 0.0

    return rule


def gated_below(z: torch.Tensor, y: torch.Tensor, lp: torch.Tensor, most: float) -> float:
    """The gated grid over the taus up to `most`: the grid's best there, kept where it wins GATE of the resamples."""
    best, acc = 0.0, balanced_accuracy(z.argmax(-1), y, z.shape[-1])
    for tau in (t for t in TAUS[1:] if t <= most):
        a = balanced_accuracy((z - tau * lp).argmax(-1), y, z.shape[-1])
        if a > acc + 1e-12:
            best, acc = tau, a
    return best if best and paired_wins(z, y, lp, best) >= GATE else 0.0


def gated_acc(z: torch.Tensor, y: torch.Tensor, lp: torch.Tensor) -> float:
    """The gated tau, dropped where the validation accuracy it costs exceeds the balanced accuracy it gains."""
    tau, c = choose_tau(z, y, lp)["tau"], z.shape[-1]

    def acc_plus_balanced(pred: torch.Tensor) -> float:
        return float((pred == y).float().mean()) + balanced_accuracy(pred, y, c)

    kept = tau and acc_plus_balanced((z - tau * lp).argmax(-1)) >= acc_plus_balanced(z.argmax(-1)) - 1e-12
    return tau if kept else 0.0


def paired_wins(z: torch.Tensor, y: torch.Tensor, lp: torch.Tensor, tau: float) -> float:
    return bootstrap_wins(z.argmax(-1), (z - tau * lp).argmax(-1), y, z.shape[-1])


RULES = {
    "none": lambda z, y, lp: 0.0,
    "grid": lambda z, y, lp: fit_tau(z, y, lp)[0],
    "one": lambda z, y, lp: 1.0,
    "calibrated": lambda z, y, lp: fit_temperature(z, y),
    "balanced_nll": tau_balanced_nll,
    "gated": lambda z, y, lp: choose_tau(z, y, lp)["tau"],
    "gated99": gated_at(0.99, paired_wins),
    "oob": gated_at(0.95, lambda z, y, lp, tau: oob_wins(z, y, lp)),
    "gated_cap1": lambda z, y, lp: gated_below(z, y, lp, 1.0),
    "gated_acc": gated_acc,
}


def main() -> None:
    for log, test, path in runs(__doc__.split("\n\n")[0]):
        ckpt = load_checkpoint(path)
        record = ckpt.get("logit_adjustment") or {"tau": 0.0}
        dm = training_data(path, ckpt, ckpt["hyper_parameters"])
        val_files, val_y = zip(*dm.samples["val"])
        test_files, test_y = labelled_files(test)
        if "prior" not in record:
            raise SystemExit(f"{path}: no logit_adjustment record (a run the long-tail rule did not apply to)")
        lp = torch.tensor(record["prior"]).log()  # (C,) the training split's log class shares
        raw = {
            name: logits_of(path, files) + record["tau"] * lp
            for name, files in (("val", list(val_files)), ("test", test_files))
        }
        vy, c = torch.tensor(val_y), raw["val"].shape[-1]
        for rule, choose in RULES.items():
            tau = float(choose(raw["val"], vy, lp))
            gain = balanced_accuracy((raw["val"] - tau * lp).argmax(-1), vy, c) - balanced_accuracy(
                raw["val"].argmax(-1), vy, c
            )
            pred = (raw["test"] - tau * lp).argmax(-1)
            acc, bal = (pred == test_y).float().mean(), balanced_accuracy(pred, test_y, c)
            row = {"log": log, "rule": rule, "tau": round(tau, 3), "val_gain": round(100 * gain, 2)}
            print(json.dumps({**row, "test": [round(100 * float(acc), 2), round(100 * float(bal), 2)]}), flush=True)


if __name__ == "__main__":
    main()
