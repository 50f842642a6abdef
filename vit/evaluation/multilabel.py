"""What a multi-label model's outputs mean (data.task "multilabel"): each label's sigmoid probability, the threshold
above which the label is given (chosen per label on the validation set after fit: the one with the best F1 there),
and the scores vit-train and vit-eval report, beside a per-label majority baseline: every label given to every image
when more than half the training images carry it, with its training share as a constant score.

    thresholds = label_thresholds(probs, targets)             # (N, C) sigmoid probabilities, (N, C) 0/1 targets
    scores = multilabel_scores(probs, targets, thresholds)    # mAP, F1 macro / micro, per label
"""

import torch
from torchmetrics.functional.classification import multilabel_average_precision

DEFAULT_THRESHOLD = 0.5  # a label no validation image carries keeps it


def label_thresholds(probs: torch.Tensor, targets: torch.Tensor) -> list[float]:
    """Per label, the probability threshold with the best F1 on (N, C) probs against (N, C) 0/1 targets: the
    midpoint between the lowest probability given the label and the next one below (ties: the lowest threshold)."""
    out = []
    for c in range(probs.shape[1]):
        p, t = probs[:, c].double(), targets[:, c].bool()
        if not t.any():
            out.append(DEFAULT_THRESHOLD)
            continue
        order = p.argsort(descending=True)
        p, t = p[order], t[order].double()
        tp = t.cumsum(0)  # giving the label to the top k images: tp, and k - tp false positives
        f1 = 2 * tp / (torch.arange(1, len(p) + 1, dtype=torch.float64) + t.sum())
        k = int(f1.argmax())
        below = float(p[k + 1]) if k + 1 < len(p) else 0.0
        out.append(round((float(p[k]) + below) / 2, 6))
    return out


def multilabel_scores(probs: torch.Tensor, targets: torch.Tensor, thresholds: list[float]) -> dict:
    """mAP (macro over the labels some image carries), F1 macro and micro at the thresholds, and per label its
    AP, precision, recall, F1 and support."""
    t = targets.bool()
    pred = probs >= torch.tensor(thresholds, dtype=probs.dtype)
    tp, fp, fn = (pred & t).sum(0).double(), (pred & ~t).sum(0).double(), (~pred & t).sum(0).double()
    present = t.any(0)
    ap = multilabel_average_precision(probs, targets.long(), num_labels=probs.shape[1], average="none")
    f1 = 2 * tp / (2 * tp + fp + fn).clamp(min=1)
    return {
        "mAP": float(ap[present].mean()) if present.any() else 0.0,
        "f1_macro": float(f1[present].mean()) if present.any() else 0.0,
        "f1_micro": float(2 * tp.sum() / (2 * tp.sum() + fp.sum() + fn.sum()).clamp(min=1)),
        "per_label": {
            "ap": ap.tolist(),
            "precision": (tp / (tp + fp).clamp(min=1)).tolist(),
            "recall": (tp / (tp + fn).clamp(min=1)).tolist(),
            "f1": f1.tolist(),
            "support": t.sum(0).tolist(),
        },
    }


def majority_baseline(train_share: torch.Tensor, targets: torch.Tensor) -> dict:
    """multilabel_scores of the per-label majority guess: each label's training share (C,) as every image's
    probability, given where it is over 0.5."""
    probs = train_share.double().expand(len(targets), -1).clone()
    return multilabel_scores(probs, targets, [DEFAULT_THRESHOLD] * probs.shape[1])


def multilabel_report(probs: torch.Tensor, targets: torch.Tensor, thresholds: list[float], train_share, classes):
    """vit-eval's metrics.json for a multi-label model: multilabel_scores at the stored thresholds, the per-label
    majority baseline's (train_share: (C,) share of training images carrying each label), and per label a row."""
    scores = multilabel_scores(probs, targets, thresholds)
    base = majority_baseline(torch.as_tensor(train_share, dtype=torch.float64), targets)
    per = scores.pop("per_label")
    rows = [
        {
            "label": name,
            "threshold": thresholds[c],
            **{k: per[k][c] for k in per},
            "baseline_ap": base["per_label"]["ap"][c],
        }
        for c, name in enumerate(classes)
    ]
    return {
        "task": "multilabel",
        "n": len(targets),
        **scores,
        "baseline": {k: base[k] for k in ("mAP", "f1_macro", "f1_micro")},
        "per_label": rows,
    }


def report_page(metrics: dict, title: str) -> str:
    """index.html of a multi-label report: the scores beside the baseline, then a row per label."""
    from html import escape

    head = "<tr><th></th><th>mAP</th><th>F1 macro</th><th>F1 micro</th></tr>"
    summary = "".join(
        f"<tr><td>{name}</td>" + "".join(f"<td>{m[k]:.4f}</td>" for k in ("mAP", "f1_macro", "f1_micro")) + "</tr>"
        for name, m in (("model", metrics), ("per-label majority", metrics["baseline"]))
    )
    cols = ("threshold", "ap", "baseline_ap", "precision", "recall", "f1", "support")
    labels = "".join(
        f"<tr><td>{escape(r['label'])}</td>"
        + "".join(f"<td>{r[c]}</td>" if c == "support" else f"<td>{r[c]:.4f}</td>" for c in cols)
        + "</tr>"
        for r in metrics["per_label"]
    )
    return (
        f"<!doctype html><meta charset='utf-8'><title>{escape(title)}</title><h1>{escape(title)}</h1>"
        f"<p>{metrics['n']} images, several labels each; a label is given at or above its threshold.</p>"
        f"<table>{head}{summary}</table><h2>Per label</h2><table><tr><th>label</th>"
        + "".join(f"<th>{c}</th>" for c in cols)
        + f"</tr>{labels}</table>"
    )
