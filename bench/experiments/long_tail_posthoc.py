"""Post-hoc logit adjustment (Menon et al., 2021) of plainly trained checkpoints of a long-tailed folder: balanced
accuracy on the checkpoint's own (balanced) validation split with `logits - tau * log(prior)`, the prior being the
training folder's class shares, tau chosen on one half of the split and measured on the other (both ways). No
training: one forward over the validation files per checkpoint. For checkpoints of plain runs
(`--model.posthoc_logit_adjust false`): what the long-tail plan adds to them.

    python bench/experiments/long_tail_posthoc.py checkpoints/fmnist_lt100_plain/version_*/best-*.ckpt
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vit.deployment.labelled import FileBatches, training_data  # noqa: E402
from vit.evaluation.logit_adjustment import fit_tau, log_prior  # noqa: E402
from vit.evaluation.report import score  # noqa: E402
from vit.evaluation.scores import balanced_accuracy  # noqa: E402
from vit.model.checkpoint import load_checkpoint, load_model  # noqa: E402


def main(paths: list[str]) -> None:
    """Per checkpoint: the validation split in two seeded halves; tau chosen on one, balanced accuracy measured on
    the other, both ways: plain -> adjusted."""
    for path in paths:
        model, hparams = load_model(path)
        dm = training_data(path, load_checkpoint(path), hparams)
        counts = torch.bincount(torch.tensor([t for _, t in dm.samples["train"]]), minlength=dm.num_classes)
        files, targets = zip(*dm.samples["val"])
        batches = FileBatches(list(files), list(targets), hparams, 256, None, torch.device("cpu"))
        scored = score(model, batches, torch.device("cpu"))
        logits, y, prior = scored.logits, scored.targets, log_prior(counts.tolist())
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
        halves = perm[: len(perm) // 2], perm[len(perm) // 2 :]
        cells = []
        for fit, held in (halves, halves[::-1]):
            tau, _ = fit_tau(logits[fit], y[fit], prior)
            plain = balanced_accuracy(logits[held].argmax(-1), y[held], dm.num_classes)
            adjusted = balanced_accuracy((logits[held] - tau * prior).argmax(-1), y[held], dm.num_classes)
            cells.append(f"tau {tau:g}: {plain:.4f} -> {adjusted:.4f}")
        whole = balanced_accuracy(logits.argmax(-1), y, dm.num_classes)
        print(f"{path}: balanced accuracy {whole:.4f} (whole val); held-out halves: " + "; ".join(cells))


if __name__ == "__main__":
    main(sys.argv[1:])
