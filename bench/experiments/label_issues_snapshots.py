"""Run `train.py fit ... --find_label_issues true` in this process and also keep every snapshot's probabilities, so that
ranking rules can be compared offline on the same training run (bench/experiments/label_issues_rules.py). The run itself is the
product's: same plan, same callback, same label_issues.csv; this only saves `snapshots.pt` beside that file.

    python bench/experiments/label_issues_snapshots.py fit --data.root mnist8k_noisy5 --find_label_issues true --budget 5min \
        --seed_everything 0
    python bench/experiments/label_issues_rules.py mnist8k_noisy5 logs/folder/version_0/snapshots.pt
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import train  # noqa: E402
from vit.evaluation.label_issues import LabelIssueFinder  # noqa: E402

_epoch_end, _fit_end = LabelIssueFinder.on_train_epoch_end, LabelIssueFinder.on_fit_end


def on_train_epoch_end(self, trainer, pl_module) -> None:
    before = None if self._sum is None else self._sum.clone()
    count = self._count
    _epoch_end(self, trainer, pl_module)
    if self._count > count:  # this epoch was a snapshot: its probabilities are the sum's increment
        snaps = self.__dict__.setdefault("snaps", [])
        snaps.append((trainer.current_epoch, (self._sum - (0 if before is None else before)).cpu().half()))


def on_fit_end(self, trainer, pl_module) -> None:
    _fit_end(self, trainer, pl_module)
    dm = trainer.datamodule
    snaps = self.__dict__.get("snaps", [])
    torch.save(
        {
            "files": [p for p, _ in dm.samples["train"]],
            "labels": torch.tensor([t for _, t in dm.samples["train"]]),
            "classes": list(dm.class_names),
            "epochs": [e for e, _ in snaps],
            "max_epochs": trainer.max_epochs,
            "probs": torch.stack([p for _, p in snaps]) if snaps else torch.empty(0),  # (S, N, C)
        },
        self.out.with_name("snapshots.pt"),
    )


LabelIssueFinder.on_train_epoch_end, LabelIssueFinder.on_fit_end = on_train_epoch_end, on_fit_end

if __name__ == "__main__":
    train.main(sys.argv[1:])
