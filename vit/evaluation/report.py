"""What a model gets wrong: scores over a labelled set, the metrics, the figures and the report page of `vit-eval`.

    scored = score(model, batches, device, temperature)        # logits (N, C), targets, the worst images
    rows = prediction_rows(scored.logits, scored.targets, temperature)   # per image: pred, prob, loss, ...
    metrics = metrics_of(rows, classes, temperature)           # metrics.json; recomputes from predictions.csv
    confusion_image(torch.tensor(metrics["confusion_matrix"]), classes)   # vit.evaluation.confusion_image

Every number of metrics.json is a function of the per-image rows written to predictions.csv (`read_predictions`
gives them back exactly), so the file and the table always agree. Metrics come from torchmetrics, figures from
matplotlib, the confusion matrix from PIL (vit/evaluation/confusion_image.py, which training logs too). The command
is vit/commands/eval.py.
"""

import base64
import csv
import html
import io
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files and TensorBoard only: no display
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torchmetrics.functional.classification import (  # noqa: E402
    multiclass_confusion_matrix,
    multiclass_f1_score,
    multiclass_precision,
    multiclass_recall,
)

from vit.evaluation.calibration import probabilities  # noqa: E402
from vit.evaluation.scores import ECE_BINS, balanced_accuracy, top1_ece  # noqa: E402

# --- confusion counts (also used at the end of training) -------------------------------------------------------------


# --- scoring a labelled set ------------------------------------------------------------------------------------------


@dataclass
class Scored:
    logits: torch.Tensor  # (N, C) float32, on the CPU, in the order of the batches
    targets: torch.Tensor  # (N,) long
    worst_images: torch.Tensor  # (K, C, H, W) the normalised inputs of the K highest losses, highest first
    worst_rows: torch.Tensor  # (K,) their positions in logits


def score(model, batches, device: torch.device, temperature: float = 1.0, worst: int = 16) -> Scored:
    """Logits of every (normalised images, targets) batch, and the `worst` images by served-probability loss.

    The worst images are kept on the device as the batches go (a running top-k over the kept ones and the new batch):
    no second pass over the data and no host read per batch beyond the logits' copy."""
    model = model.to(device).eval()
    logits_all, targets_all = [], []
    kept_x = kept_loss = kept_rows = None
    seen = 0
    with torch.inference_mode():
        for x, y in batches:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            logits = model(x).float()  # (B, C)
            loss = F.cross_entropy(logits / temperature, y, reduction="none")  # (B,)
            rows = torch.arange(seen, seen + len(y), device=device)
            seen += len(y)
            if kept_x is not None:
                x, loss, rows = torch.cat([kept_x, x]), torch.cat([kept_loss, loss]), torch.cat([kept_rows, rows])
            top = loss.topk(min(worst, len(loss))).indices
            kept_x, kept_loss, kept_rows = x[top], loss[top], rows[top]
            logits_all.append(logits.cpu())
            targets_all.append(y.cpu())
    if not logits_all:
        raise ValueError("no image to evaluate")
    return Scored(torch.cat(logits_all), torch.cat(targets_all), kept_x.cpu(), kept_rows.cpu())


def prediction_rows(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> dict[str, torch.Tensor]:
    """Per image (N,): `true`, `pred`, `prob` (the served probability of pred: softmax(logits / T)), `loss`
    (-log of the served probability of the true class), `true_rank` (1: the true class has the highest logit),
    `prob_raw` and `loss_raw` (the same with T = 1). The argmax does not depend on T."""
    logits = logits.float()
    probs = probabilities(logits, temperature)
    pred = probs.argmax(-1)
    true_logit = logits.gather(1, targets[:, None])
    return {
        "true": targets.long(),
        "pred": pred,
        "prob": probs.gather(1, pred[:, None])[:, 0],
        "loss": F.cross_entropy(logits / temperature, targets, reduction="none"),
        "true_rank": 1 + (logits > true_logit).sum(dim=-1),
        "prob_raw": logits.softmax(-1).gather(1, pred[:, None])[:, 0],
        "loss_raw": F.cross_entropy(logits, targets, reduction="none"),
    }


# --- metrics -------------------------------------------------------------------------------------------------------


def metrics_of(rows: dict[str, torch.Tensor], classes: list[str], temperature: float, most_confused: int = 10) -> dict:
    """metrics.json from the per-image rows: top-1/5, balanced accuracy (the mean recall over the classes that have
    images), macro F1 (over the classes that occur as a target or a prediction: torchmetrics' macro), per-class
    precision/recall/F1/support, the confusion matrix (rows: true class), the most confused pairs, NLL and ECE
    (15 equal-width bins) of the served and of the raw probabilities."""
    true, pred, c = rows["true"], rows["pred"], len(classes)
    correct = (pred == true).long()
    precision = multiclass_precision(pred, true, c, average=None, zero_division=0)
    recall = multiclass_recall(pred, true, c, average=None, zero_division=0)
    f1 = multiclass_f1_score(pred, true, c, average=None, zero_division=0)
    cm = multiclass_confusion_matrix(pred, true, c)
    support = cm.sum(dim=1)
    pairs = [(int(cm[i, j]), i, j) for i in range(c) for j in range(c) if i != j and cm[i, j] > 0]
    pairs.sort(key=lambda p: (-p[0], p[1], p[2]))
    return {
        "n": len(true),
        "classes": list(classes),
        "top1": float(correct.double().mean()),
        "top5": float((rows["true_rank"] <= 5).double().mean()),
        "balanced_accuracy": balanced_accuracy(pred, true, c),
        "f1_macro": float(multiclass_f1_score(pred, true, c, average="macro", zero_division=0)),
        "per_class": [
            {
                "class": name,
                "precision": float(precision[i]),
                "recall": float(recall[i]),
                "f1": float(f1[i]),
                "support": int(support[i]),
            }
            for i, name in enumerate(classes)
        ],
        "confusion_matrix": cm.tolist(),
        "most_confused": [{"true": classes[i], "pred": classes[j], "count": n} for n, i, j in pairs[:most_confused]],
        "nll": float(rows["loss"].double().mean()),
        "ece": top1_ece(rows["prob"], correct),
        "nll_uncalibrated": float(rows["loss_raw"].double().mean()),
        "ece_uncalibrated": top1_ece(rows["prob_raw"], correct),
        "temperature": temperature,
    }


# --- predictions.csv -----------------------------------------------------------------------------------------------

CSV_COLUMNS = ("path", "true", "pred", "prob", "loss", "true_rank", "prob_raw", "loss_raw")
FLOAT_COLUMNS = ("prob", "loss", "prob_raw", "loss_raw")


def write_predictions(path: Path, ids: list[str], rows: dict[str, torch.Tensor], classes: list[str]) -> None:
    """A row per image: path, true and predicted class names, then the numbers. Floats are written as the shortest
    decimal that reads back as the same float32 (repr of the exact value), so metrics recompute bit for bit."""
    columns = {k: rows[k].tolist() for k in CSV_COLUMNS[1:]}
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for n, name in enumerate(ids):
            w.writerow(
                [
                    name,
                    classes[columns["true"][n]],
                    classes[columns["pred"][n]],
                    *(repr(columns[k][n]) for k in ("prob", "loss")),
                    columns["true_rank"][n],
                    *(repr(columns[k][n]) for k in ("prob_raw", "loss_raw")),
                ]
            )


def read_predictions(path: Path, classes: list[str]) -> tuple[list[str], dict[str, torch.Tensor]]:
    """predictions.csv -> (paths, rows) as prediction_rows gives them."""
    index = {c: i for i, c in enumerate(classes)}
    with open(path, newline="") as f:
        records = list(csv.DictReader(f))
    rows = {
        "true": torch.tensor([index[r["true"]] for r in records], dtype=torch.long),
        "pred": torch.tensor([index[r["pred"]] for r in records], dtype=torch.long),
        "true_rank": torch.tensor([int(r["true_rank"]) for r in records], dtype=torch.long),
    }
    for k in FLOAT_COLUMNS:
        rows[k] = torch.tensor([float(r[k]) for r in records], dtype=torch.float32)
    return [r["path"] for r in records], rows


def write_per_class(path: Path, metrics: dict) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["class", "precision", "recall", "f1", "support"])
        w.writeheader()
        w.writerows(metrics["per_class"])


# --- figures -------------------------------------------------------------------------------------------------------


def reliability_bins(confidence: torch.Tensor, correct: torch.Tensor, bins: int = ECE_BINS):
    """Per equal-width confidence bin: (mean confidence, accuracy, count), empty bins as NaN / 0."""
    which = (confidence.double() * bins).ceil().long().clamp(1, bins) - 1  # (0, 1/b] -> bin 0, as torchmetrics
    count = torch.bincount(which, minlength=bins).double()
    conf = torch.bincount(which, weights=confidence.double(), minlength=bins) / count
    acc = torch.bincount(which, weights=correct.double(), minlength=bins) / count
    return conf, acc, count


def reliability_figure(rows: dict[str, torch.Tensor], metrics: dict):
    """The reliability diagram, raw softmax and served (calibrated) probabilities side by side: the accuracy of each
    confidence bin against the diagonal of a perfectly calibrated model; bar width grows with the bin's share."""
    correct = rows["pred"] == rows["true"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.8), dpi=100, sharey=True)
    panels = (
        (axes[0], rows["prob_raw"], f"raw softmax: ECE {metrics['ece_uncalibrated']:.4f}"),
        (axes[1], rows["prob"], f"served, T = {metrics['temperature']:.3g}: ECE {metrics['ece']:.4f}"),
    )
    edges = torch.linspace(0, 1, ECE_BINS + 1)
    for ax, confidence, title in panels:
        conf, acc, count = reliability_bins(confidence, correct)
        share = count / count.sum()
        centers = (edges[:-1] + edges[1:]) / 2
        ax.bar(centers, acc.nan_to_num(0), width=1 / ECE_BINS * 0.9, color="#4c78a8", label="accuracy")
        ax.bar(  # from the accuracy to the mean confidence, whichever is higher
            centers,
            (conf - acc).abs().nan_to_num(0),
            bottom=torch.minimum(conf, acc).nan_to_num(0),
            width=1 / ECE_BINS * 0.9,
            color="#e45756",
            alpha=0.35,
            label="gap to confidence",
        )
        ax.plot([0, 1], [0, 1], "k--", lw=1, label="calibrated")
        ax2 = ax.twinx()
        ax2.plot(centers, share, "o-", color="#72b7b2", ms=3, lw=1, label="share of images")
        ax2.set_ylim(0, 1)
        ax2.set_yticks([])
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("confidence (probability of the predicted class)")
        ax.set_title(title)
    axes[0].set_ylabel("accuracy in the bin")
    axes[0].legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


def top_losses_figure(images, maps_true, maps_pred, captions: list[str], panel: int = 96):
    """The worst images, each as three panels: the image, the relevance for its true class, for the predicted one.
    images (K, 3, H, W) in [0, 1]; maps_*: (K, 3, H, W) overlays. The panels are laid out into one picture shown on
    one axes, captions as text above each cell: a grid of 3K matplotlib axes took 1.3 s to draw for K = 16."""
    k = len(images)
    cols = 4 if k > 9 else 3
    rows = -(-k // cols)
    gap, head = 8, 30  # pixels between panels, caption band above each row of cells
    cell_w = 3 * panel + 2 * gap // 2
    canvas = torch.ones(3, rows * (panel + head) + gap, cols * (cell_w + 2 * gap) + gap)
    triples = torch.stack([images, maps_true, maps_pred], dim=1).flatten(0, 1).float()  # (3K, 3, H, W)
    triples = F.interpolate(triples, size=(panel, panel), mode="nearest").view(k, 3, 3, panel, panel)
    origins = []
    for i in range(k):
        r, c = divmod(i, cols)
        top, left = r * (panel + head) + head, gap + c * (cell_w + 2 * gap)
        origins.append((top, left))
        for j in range(3):
            x0 = left + j * (panel + gap // 2)
            canvas[:, top : top + panel, x0 : x0 + panel] = triples[i, j]
    height, width = canvas.shape[1:]
    fig = plt.figure(figsize=(width / 100, height / 100 + 0.3), dpi=100)
    ax = fig.add_axes((0, 0, 1, height / (height + 30)))
    ax.imshow(canvas.permute(1, 2, 0).numpy(), interpolation="nearest")
    ax.axis("off")
    for (top, left), caption in zip(origins, captions):
        ax.text(left, top - 3, caption, fontsize=7, va="bottom", ha="left", family="sans-serif")
    fig.suptitle("highest losses: image, relevance for the true class, relevance for the predicted class", fontsize=9)
    return fig


def label_issues_figure(images, captions: list[str], source: str):
    """The training files most likely mislabelled (label_issues.csv), with the given and the suggested class."""
    k = len(images)
    cols = min(8, k)
    rows = -(-k // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 1.6, rows * 1.9), dpi=100, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, img, caption in zip(axes.flat, images, captions):
        ax.imshow(img.permute(1, 2, 0).numpy(), interpolation="nearest")
        ax.set_title(caption, fontsize=6, loc="left")
    fig.suptitle(f"likely mislabelled training files ({Path(source).name}), most likely first", fontsize=9)
    fig.tight_layout()
    return fig


def png_bytes(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


# --- the report page -----------------------------------------------------------------------------------------------

PAGE_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: .5em 0; } td, th { padding: 2px 10px; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
tr:nth-child(even) td { background: #fafafa; } tr.low td { color: #b00; font-weight: 600; }
img { max-width: 100%; border: 1px solid #eee; } .note { color: #666; font-size: .9em; }
"""


def _table(header: list[str], rows: list[list], marked: frozenset = frozenset()) -> str:
    """An HTML table; the rows whose index is in `marked` in the warning colour."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        f"<tr{' class=low' if i in marked else ''}>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r) + "</tr>"
        for i, r in enumerate(rows)
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def unknown_section(metrics: dict) -> str:
    """The page's "Unknown" part: what the checkpoint's rejection did to each class of this set, and with --ood how
    each score tells the set from the other images and how many of those the stored thresholds call unknown."""
    u, ood = metrics.get("unknown"), metrics.get("ood")
    if u is None and ood is None:
        return ""
    text = "<h2>Unknown</h2>"
    if u is not None:
        # the classes that lose more than twice the promised share, in the warning colour
        rows = [[name, "-" if v is None else f"{100 * v:.1f}%"] for name, v in u["rejected_per_class"].items()]
        low = frozenset(i for i, v in enumerate(u["rejected_per_class"].values()) if v is not None and v > 0.10)
        text += (
            f"<p>{html.escape(u['score'])} below the predicted class's threshold: {100 * u['rejected']:.1f}% of these "
            "images called unknown, by class:</p>" + _table(["class", "called unknown"], rows, low)
        )
    if ood is not None:
        applied = (u or {}).get("score")
        rows = [
            [
                name + (" (the checkpoint's)" if name == applied else ""),
                f"{r['auroc']:.3f}",
                f"{r['fpr_at_95_tpr']:.3f}",
            ]
            for name, r in ood.items()
            if name != "rejected_by_the_checkpoint"
        ]
        text += "<p>Against the --ood images (AUROC: 1 tells them apart, 0.5 chance):</p>" + _table(
            ["score", "AUROC", "FPR at 95% TPR"], rows
        )
        if "rejected_by_the_checkpoint" in ood:
            text += (
                f"<p>The checkpoint's thresholds call <b>{100 * ood['rejected_by_the_checkpoint']:.1f}%</b> of the "
                "--ood images unknown.</p>"
            )
    return text


def report_html(metrics: dict, figures: dict[str, bytes], title: str) -> str:
    """One self-contained page: the summary, the figures inlined as data: URIs, per-class and most-confused tables.
    Nothing is fetched from elsewhere and there is no script."""

    def image(name: str, alt: str) -> str:
        data = base64.b64encode(figures[name]).decode("ascii")
        return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}">'

    pct = lambda v: f"{100 * v:.2f}%"  # noqa: E731
    summary = [
        ["images", metrics["n"]],
        ["top-1 accuracy", pct(metrics["top1"])],
        ["top-5 accuracy", pct(metrics["top5"])],
        ["balanced accuracy (mean per-class recall)", pct(metrics["balanced_accuracy"])],
        ["macro F1", f"{metrics['f1_macro']:.4f}"],
        ["NLL, served probabilities (raw)", f"{metrics['nll']:.4f} ({metrics['nll_uncalibrated']:.4f})"],
        ["ECE, served probabilities (raw)", f"{metrics['ece']:.4f} ({metrics['ece_uncalibrated']:.4f})"],
        ["calibration temperature", f"{metrics['temperature']:.4g}"],
    ]
    per_class = [
        [r["class"], f"{r['precision']:.3f}", f"{r['recall']:.3f}", f"{r['f1']:.3f}", r["support"]]
        for r in metrics["per_class"]
    ]
    # the three classes with the lowest recall, in the warning colour
    ranked = sorted((r["recall"], i) for i, r in enumerate(metrics["per_class"]) if r["support"])
    low = frozenset(i for _, i in ranked[:3])
    confused = [[p["true"], p["pred"], p["count"]] for p in metrics["most_confused"]]
    issues = ""
    if "label_issues.png" in figures:  # the run's --find_label_issues list
        issues = (
            f"<h2>Label issues found in training ({metrics['label_issues']} files)</h2>"
            + image("label_issues.png", "training files whose label looks wrong")
            + '<p class="note">From label_issues.csv of the checkpoint\'s run: the given class had a low probability '
            "all through training. Check these files first.</p>"
        )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{PAGE_STYLE}</style></head>
<body>
<h1>{html.escape(title)}</h1>
{_table(["", "value"], [[k, v] for k, v in summary])}
<p class="note">Probabilities are softmax(logits / T), the ones vit-predict and vit-serve give; "raw": T = 1.
ECE: 15 equal-width confidence bins.</p>
<h2>Confusion matrix</h2>{image("confusion_matrix.png", "confusion matrix")}
<h2>Per class</h2>{_table(["class", "precision", "recall", "F1", "support"], per_class, low)}
<p class="note">In red: the three classes with the lowest recall.</p>
<h2>Most confused (true &rarr; predicted)</h2>{
        _table(["true", "predicted", "images"], confused) if confused else "<p>no mistakes</p>"
    }
<h2>Reliability</h2>{image("reliability.png", "reliability diagram")}
<h2>Highest losses</h2>{image("top_losses.png", "the images with the highest losses and their relevance maps")}
<p class="note">Each: the image, the relevance map for its true class and for the predicted class (Chefer et al.,
2021). Often the worst losses are mislabelled files.</p>
{unknown_section(metrics)}{issues}</body></html>
"""
