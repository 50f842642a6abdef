"""Compare label-issue rules offline on the snapshots of one `--find_label_issues true` run
(bench/experiments/label_issues_snapshots.py), scored against the files moved on purpose (noise.json of
bench/data/long_tail.py --noise). A rule is a ranking (which files first) and a list length (how many are called
issues); the product's label_issues.csv is the first `length` files of the ranking. Printed: each ranking's precision
at K (K = the number moved), each length rule's length, and each combination's top-K precision as scored by
bench/experiments/label_issues_score.py (hits in the list's first K over K: a list shorter than K counts the shortfall as misses).

    python bench/experiments/label_issues_rules.py ROOT SNAPSHOTS.pt
"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def rankings(probs: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """(S, N, C) snapshot probabilities -> {name: (N,) indices, most likely wrong first}."""
    from cleanlab.filter import find_label_issues

    rows = torch.arange(len(labels))
    given = probs[:, rows, labels]  # (S, N)
    others = probs.clone()
    others[:, rows, labels] = -1
    margin = given - others.max(-1).values  # (S, N): AUM's margin, in probabilities
    avg = probs.mean(0)
    out = {
        "avg_self_confidence": given.mean(0).argsort(),
        "last_self_confidence": given[-1].argsort(),
        "avg_margin": margin.mean(0).argsort(),
        "last_half_self_confidence": given[len(given) // 2 :].mean(0).argsort(),
    }
    cl = find_label_issues(labels.numpy(), avg.double().numpy(), return_indices_ranked_by="self_confidence")
    out["cleanlab_avg (its own list)"] = torch.as_tensor(cl, dtype=torch.long)
    return out


def lengths(probs: torch.Tensor, labels: torch.Tensor) -> dict[str, int]:
    """How many files each rule calls issues."""
    from cleanlab.count import num_label_issues
    from cleanlab.filter import find_label_issues

    avg = probs.mean(0).double().numpy()
    y = labels.numpy()
    out = {}
    for by in ("prune_by_noise_rate", "both", "confident_learning", "predicted_neq_given"):
        out[f"cleanlab {by} (avg)"] = int(find_label_issues(y, avg, filter_by=by).sum())
    out["cleanlab num_label_issues (avg)"] = int(num_label_issues(y, avg))
    out["cleanlab num_label_issues off_diagonal_calibrated (avg)"] = int(
        num_label_issues(y, avg, estimation_method="off_diagonal_calibrated")
    )
    out["argmax(avg) != given"] = int((probs.mean(0).argmax(-1) != labels).sum())
    out["argmax(last) != given"] = int((probs[-1].argmax(-1) != labels).sum())
    return out


def main(root: str, snapshots: str) -> None:
    s = torch.load(snapshots)
    probs, labels = s["probs"].float(), s["labels"]
    noise = json.loads(Path(root, "noise.json").read_text())["noise"]
    rel = [Path(f).resolve().relative_to(Path(root).resolve()).as_posix() for f in s["files"]]
    moved = torch.tensor([r in noise for r in rel])
    k = int(moved.sum())
    result = {"moved": k, "files": len(labels), "snapshot_epochs": s["epochs"], "max_epochs": s["max_epochs"]}
    ranks = rankings(probs, labels)
    result["precision_at_k"] = {name: round(float(moved[idx[:k]].sum()) / k, 4) for name, idx in ranks.items()}
    lens = lengths(probs, labels)
    result["lengths"] = lens
    result["top_k_precision of ranking x length"] = {
        f"{name} x {ln}": round(float(moved[idx[: min(k, n)]].sum()) / k, 4)
        for name, idx in ranks.items()
        if "own list" not in name
        for ln, n in lens.items()
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
