"""Post-hoc logit adjustment (Menon et al., 2021) of plainly trained checkpoints of a long-tailed folder: balanced
accuracy on the checkpoint's own (balanced) validation split with `logits - tau * log(prior)`, the prior being the
training folder's class shares, for a few tau. No training: one forward over the validation files per checkpoint.

    python bench/long_tail_posthoc.py checkpoints/fmnist_lt100_plain/version_*/best-*.ckpt
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vit.checkpoint import load_checkpoint, load_model  # noqa: E402
from vit.commands.eval import FileBatches, training_data  # noqa: E402
from vit.evaluation import score  # noqa: E402

TAUS = (0.0, 0.5, 1.0, 1.5)


def balanced_accuracy(pred: torch.Tensor, true: torch.Tensor, num_classes: int) -> float:
    recall = [(pred[true == c] == c).double().mean() for c in range(num_classes) if (true == c).any()]
    return float(torch.stack(recall).mean())


def main(paths: list[str]) -> None:
    for path in paths:
        model, hparams = load_model(path)
        dm = training_data(path, load_checkpoint(path), hparams)
        counts = torch.bincount(torch.tensor([t for _, t in dm.samples["train"]]), minlength=dm.num_classes)
        files, targets = zip(*dm.samples["val"])
        batches = FileBatches(list(files), list(targets), hparams, 256, None, torch.device("cpu"))
        scored = score(model, batches, torch.device("cpu"))
        log_prior = (counts.double() / counts.sum()).log().float()
        cells = []
        for tau in TAUS:
            pred = (scored.logits - tau * log_prior).argmax(-1)
            cells.append(f"tau {tau:g}: {balanced_accuracy(pred, scored.targets, dm.num_classes):.4f}")
        print(f"{path}: " + ", ".join(cells))


if __name__ == "__main__":
    main(sys.argv[1:])
