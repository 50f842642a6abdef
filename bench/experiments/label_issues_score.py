"""Score a label_issues.csv against the files moved on purpose (noise.json of bench/data/long_tail.py --noise):
precision and recall of the top-K list, K = the number moved, against two baselines: random (precision = the noise
rate) and the trained model's own loss ranking (the K training files with the highest loss in a vit-eval
predictions.csv of the training folder).

    python train.py fit --data.root mnist8k_noisy5 --find_label_issues true --budget 5min --seed_everything 0
    vit-eval --ckpt checkpoints/folder/version_0/last.ckpt mnist8k_noisy5/train --out eval_train/
    python bench/experiments/label_issues_score.py mnist8k_noisy5 logs/folder/version_0/label_issues.csv eval_train/predictions.csv
"""

import csv
import json
import sys
from pathlib import Path


def relative(path: str, root: Path) -> str:
    return Path(path).resolve().relative_to(root.resolve()).as_posix()


def main(root: str, issues_csv: str, predictions_csv: str | None = None) -> None:
    root_path = Path(root)
    noise = json.loads((root_path / "noise.json").read_text())["noise"]
    moved = set(noise)
    n_train = sum(json.loads((root_path / "noise.json").read_text())["counts"].values())
    k = len(moved)
    with open(issues_csv, newline="") as f:
        listed = [relative(r["path"], root_path) for r in csv.DictReader(f)]
    top = listed[:k]
    hits = len(set(top) & moved)
    result = {
        "moved": k,
        "listed": len(listed),
        "precision_at_k": hits / k,
        "recall_at_k": hits / k,
        "precision_of_list": len(set(listed) & moved) / max(1, len(listed)),
        "recall_of_list": len(set(listed) & moved) / k,
        "random_precision": k / n_train,
    }
    if predictions_csv:
        with open(predictions_csv, newline="") as f:
            rows = list(csv.DictReader(f))
        by_loss = sorted(rows, key=lambda r: -float(r["loss"]))[:k]
        result["loss_ranking_precision_at_k"] = len({relative(r["path"], root_path) for r in by_loss} & moved) / k
    print(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
