"""Files whose label is probably wrong, from the run's own training dynamics, ranked by cleanlab.

    vit-train fit --data.root PATH --find_label_issues true [--budget 5min]   # -> <log dir>/label_issues.csv

A few times during training (SNAPSHOTS, evenly spaced over the epochs) the model scores every training image without
augmentation, and the softmax of those snapshots is averaged. A mislabelled file is learned late or never: its given
class keeps a low probability over the snapshots, while a clean hard image is learned by the middle of the run (the
reasoning of Pleiss et al., 2020, "Identifying mislabeled data using the area under the margin ranking"). The averaged
probabilities go to `cleanlab.filter.find_label_issues` (Northcutt et al., 2021), which calls a file an issue when
its averaged prediction is another class and ranks the issues by self-confidence; label_issues.csv lists them most
likely wrong first: `path,given,suggested,score` (score: the averaged probability of the given class, low = likely
wrong). The snapshot passes run on the training device at the end of an epoch, a forward per batch, no host read per
step; the budget's epoch timing (vit.run.fit_budget.FitBudget) counts them.
"""

import csv
from pathlib import Path

import lightning as L
import torch

from vit.data.device import DeviceBatches

SNAPSHOTS = 8


def snapshot_epochs(max_epochs: int, snapshots: int = SNAPSHOTS) -> set[int]:
    """The epochs (0-based) after which the training set is scored: `snapshots` evenly spaced, the last included."""
    n = max(1, min(snapshots, max_epochs))
    return {round((i + 1) * max_epochs / n) - 1 for i in range(n)}


def rank_label_issues(labels: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cleanlab's label issues of (N,) labels under (N, C) out-of-training-order probabilities: (indices, most likely
    wrong first; the averaged probability of the given class for each)."""
    from cleanlab.filter import find_label_issues

    # "predicted_neq_given": an issue is a file whose averaged snapshot prediction is not its given class. cleanlab's
    # default, "prune_by_noise_rate", estimates the noise from the confident joint, and on these in-training
    # probabilities it listed fewer files than were moved (MNIST 8k, 442 moved: 402 / 416 / 414 listed, top-K
    # precision 0.87 / 0.87 / 0.90); the same runs' snapshots listed 536 / 578 / 519 this way, top-K precision
    # 0.96 / 0.94 / 0.96 (bench/experiments/label_issues_rules.py, docs/evaluation.md).
    issues = find_label_issues(
        labels.numpy(),
        probs.double().numpy(),
        return_indices_ranked_by="self_confidence",
        filter_by="predicted_neq_given",
    )
    index = torch.as_tensor(issues, dtype=torch.long)
    return index, probs[index, labels[index]]


def write_label_issues(path: Path, files: list[str], labels, probs, classes: list[str]) -> int:
    """label_issues.csv: `path,given,suggested,score`, most likely wrong first. Returns how many rows."""
    index, score = rank_label_issues(labels, probs)
    suggested = probs.argmax(dim=-1)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "given", "suggested", "score"])
        for i, s in zip(index.tolist(), score.tolist()):
            w.writerow([files[i], classes[int(labels[i])], classes[int(suggested[i])], f"{s:.6f}"])
    return len(index)


def read_label_issues(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def label_issue_finder(datamodule, folder: str | Path | None) -> "LabelIssueFinder":
    """The callback for `--find_label_issues true`, writing `folder`/label_issues.csv; a ValueError that says why
    when the run cannot have one (not a folder of images, several labels an image, nowhere to write)."""
    from vit.data.folder import ImageFolderDataModule

    if not isinstance(datamodule, ImageFolderDataModule):
        raise ValueError("--find_label_issues true needs a folder of images (--data.root PATH)")
    if datamodule.task == "multilabel":
        raise ValueError("--find_label_issues true ranks one label an image; not for multi-label data")
    if folder is None:
        raise ValueError("--find_label_issues true needs a logger or checkpoints: where would label_issues.csv go?")
    return LabelIssueFinder(Path(folder, "label_issues.csv").resolve())


class LabelIssueFinder(L.Callback):
    """Averages the softmax over the training images at `snapshot_epochs`, then writes label_issues.csv to `out` at
    the end of fit (on rank zero). For a folder (vit.data.ImageFolderDataModule): its training files are the rows."""

    def __init__(self, out: Path):
        self.out = Path(out)
        self._sum: torch.Tensor | None = None  # (N, C) summed probabilities, on the training device
        self._count = 0

    def _batches(self, trainer):
        dm = trainer.datamodule
        if "train" in dm.memory:
            images, targets = dm.memory["train"]
            return DeviceBatches(
                images, targets, dm.eval_batch_size, dm.mean, dm.std, train=False, out_size=dm.img_size
            )
        return torch.utils.data.DataLoader(
            dm._dataset("train", dm.eval_tf), batch_size=dm.eval_batch_size, num_workers=dm.num_workers
        )

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        checkpoint["label_issues"] = str(self.out.resolve())  # vit-eval shows the file's gallery when it is there

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        # Rank zero alone scores the whole training set (each rank holds all of it): a plain forward of the module, no
        # collective, so the other ranks only wait at their next all-reduce.
        if trainer.current_epoch not in snapshot_epochs(trainer.max_epochs or 1) or not trainer.is_global_zero:
            return
        was_training = pl_module.training
        pl_module.eval()
        chunks = []
        with torch.inference_mode():
            for x, _ in self._batches(trainer):
                chunks.append(pl_module(x.to(pl_module.device)).float().softmax(-1))
        pl_module.train(was_training)
        probs = torch.cat(chunks)
        self._sum = probs if self._sum is None else self._sum + probs
        self._count += 1

    def on_fit_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero or self._sum is None:
            return
        dm = trainer.datamodule
        files = [p for p, _ in dm.samples["train"]]
        labels = torch.tensor([t for _, t in dm.samples["train"]], dtype=torch.long)
        n = write_label_issues(self.out, files, labels, (self._sum / self._count).cpu(), list(dm.class_names))
        print(f"label issues: {n} of {len(files)} training files look mislabelled, most likely first: {self.out}")
