"""Compare rankings of label issues offline, from a run's last checkpoint over its training folder: cleanlab on the
final model's probabilities, and the final model's own loss ranking, scored like bench/experiments/label_issues_score.py.

    python bench/experiments/label_issues_offline.py ROOT CKPT
"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vit.deployment.labelled import FileBatches, labelled_folder  # noqa: E402
from vit.evaluation.label_issues import rank_label_issues  # noqa: E402
from vit.evaluation.report import score  # noqa: E402
from vit.model.checkpoint import load_model  # noqa: E402


def main(root: str, ckpt: str) -> None:
    model, hp = load_model(ckpt)
    classes = hp.class_names
    files, targets = labelled_folder(Path(root, "train"), classes)
    scored = score(model, FileBatches(files, targets, hp, 256, None, torch.device("cpu")), torch.device("cpu"))
    probs, labels = scored.logits.softmax(-1), scored.targets
    moved = set(json.loads(Path(root, "noise.json").read_text())["noise"])
    rel = [Path(f).resolve().relative_to(Path(root).resolve()).as_posix() for f in files]
    k = len(moved)
    index, _ = rank_label_issues(labels, probs)
    by_loss = probs[torch.arange(len(labels)), labels].argsort()[:k]  # the lowest probability of the given class
    hits = lambda idx: len({rel[i] for i in idx.tolist()} & moved) / k  # noqa: E731
    print(json.dumps({"cleanlab_final_listed": len(index), "cleanlab_final_p_at_k": hits(index[:k]),
                      "loss_p_at_k": hits(by_loss)}))  # fmt: skip


if __name__ == "__main__":
    main(*sys.argv[1:])
