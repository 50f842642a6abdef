"""The passes behind `vit-eval` (vit/commands/eval.py): the labelled images a report scores, decoded and batched as
vit-predict does (batches_for); a multi-label model's report (evaluate_multilabel); the rejection scores of images of
none of the classes (ood_scores); and the lines the command prints about "unknown".

    batches, ids_of, files, title = batches_for(EvalSet(ckpt="best.ckpt", split="val"), record, device)
"""

import csv
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from vit.data.base import whole_val_batches
from vit.data.device import DeviceBatches
from vit.data.images import expand_inputs
from vit.data.transforms import DataError
from vit.deployment.labelled import FileBatches, labelled_folder, training_data
from vit.evaluation.image_features import features_of
from vit.evaluation.unknown import record_scores
from vit.model.record import CheckpointRecord


@dataclass(frozen=True)
class EvalSet:
    """Which labelled images a report scores and how they are read: `data` (a folder of <class>/<image> files or
    torch/<name>) or `split` ("val" or "test": the checkpoint's own, from its data record)."""

    ckpt: str
    data: str | None = None
    split: str | None = None
    download_root: str = "data"  # where torch/<name> datasets lie (no download)
    batch_size: int = 64
    workers: int | None = None  # decoding workers; None: as vit-predict


def batches_for(source: EvalSet, record: CheckpointRecord, device: torch.device):
    """(batches, ids_of(n): the names of the n images scored, known after the pass, the FileBatches or None, title)."""
    files_of = lambda fb: lambda n: [fb.files[i] for i in fb.kept]  # noqa: E731
    if source.split is not None:
        dm = training_data(source.ckpt, record)
        samples = getattr(dm, "samples", None) or {}
        if source.split == "test" and "test" not in samples:
            raise DataError(f"{source.ckpt}: its training data has no test split (a test/ folder or test rows)")
        title = "its test split" if source.split == "test" else "its validation split"
        if samples:  # a folder: its files of that split
            files, targets = zip(*samples[source.split])
            fb = FileBatches(list(files), list(targets), record, source.batch_size, source.workers, device)
            return fb, files_of(fb), fb, title
        dm.setup("validate")
        return whole_val_batches(dm), lambda n: [f"val/{i:06d}" for i in range(n)], None, title
    if source.data.startswith("torch/"):
        from vit.data.torchvision_data import eval_split

        x, y, names = eval_split(source.data, source.download_root, record.img_size, record.in_chans)
        classes = list(record.class_names)
        if names and names != classes:
            raise DataError(f"{source.data}: its classes {names[:5]}... are not the checkpoint's {classes[:5]}...")
        batches = DeviceBatches(
            x, y, source.batch_size, list(record.mean), list(record.std), train=False, out_size=record.img_size
        )
        stem = source.data.removeprefix("torch/")
        return batches, lambda n: [f"torch/{stem}/test/{i:06d}" for i in range(n)], None, f"{source.data} (test)"
    files, targets = labelled_folder(Path(source.data), list(record.class_names))
    fb = FileBatches(files, targets, record, source.batch_size, source.workers, device)
    return fb, files_of(fb), fb, source.data


def evaluate_multilabel(source: EvalSet, model, record: CheckpointRecord, device, out: Path) -> dict:
    """A multi-label model on its own validation or test split: mAP and F1 at the stored thresholds beside the
    per-label majority baseline, written to `out` (metrics.json, per_label.csv, predictions.csv, index.html); the
    metrics. Raises DataError or CheckpointError on data it cannot read."""
    from vit.evaluation.calibration import logits_of
    from vit.evaluation.multilabel import multilabel_report, report_page

    dm = training_data(source.ckpt, record)
    if source.split not in dm.samples:
        raise DataError(f"{source.ckpt}: its training data has no {source.split} split")
    items = dm.samples[source.split]
    fb = FileBatches([p for p, _ in items], dm.targets_of(items), record, source.batch_size, source.workers, device)
    logits, targets = logits_of(model, progress(fb), device)
    probs = logits.sigmoid()
    share = dm.targets_of(dm.samples["train"]).mean(0)  # (C,) training images carrying each label
    classes = list(record.class_names)
    metrics = multilabel_report(probs, targets, record.thresholds, share, classes)
    metrics["skipped"] = [{"path": p, "error": e} for p, e in fb.errors]
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    with open(out / "per_label.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(metrics["per_label"][0]))
        w.writeheader()
        w.writerows(metrics["per_label"])
    with open(out / "predictions.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "labels", "true", *[f"prob_{c}" for c in classes]])
        given = probs >= torch.tensor(record.thresholds)
        for i, k in enumerate(fb.kept):
            names = lambda row: ";".join(c for c, on in zip(classes, row) if on)  # noqa: E731
            w.writerow([fb.files[k], names(given[i]), names(targets[i] > 0.5), *[f"{p:.4f}" for p in probs[i]]])
    (out / "index.html").write_text(report_page(metrics, f"{Path(source.ckpt).name} on its {source.split} split"))
    return metrics


def ood_scores(folder: str, source: EvalSet, model, record: CheckpointRecord, device) -> tuple[dict, torch.Tensor]:
    """Every score that the checkpoint allows on the images of `folder` (any layout: none of them is of a class), and
    their logits."""
    files = expand_inputs([folder])
    if not files:
        raise DataError(f"--ood {folder}: no image files there")
    fb = FileBatches(files, [0] * len(files), record, source.batch_size, source.workers, device)
    feats, logits, _, inputs = features_of(model, progress(fb), device)
    return record_scores(record.unknown, logits, feats, inputs), logits


def unknown_lines(metrics: dict) -> str:
    """What rejection did here, and with --ood how each score tells the two sets apart."""
    text = ""
    if (u := metrics.get("unknown")) is not None:
        accepted = u["accuracy_accepted"]
        text += (
            f"unknown ({u['score']}): {100 * u['rejected']:.1f}% of these images rejected; top-1 on the accepted "
            + (f"{100 * accepted:.2f}%\n" if accepted is not None else "-\n")
        )
    if (ood := metrics.get("ood")) is not None:
        width = max(22, *(len(name) for name in ood))
        text += f"--ood: {'score':<{width}} AUROC  FPR@95%TPR\n"
        text += "".join(
            f"       {name:<{width}} {r['auroc']:.4f} {r['fpr_at_95_tpr']:.4f}\n"
            for name, r in ood.items()
            if isinstance(r, dict)
        )
        if "rejected_by_the_checkpoint" in ood:
            share = 100 * ood["rejected_by_the_checkpoint"]
            text += f"       the checkpoint's thresholds call {share:.1f}% of them unknown\n"
    return text


def progress(batches):
    """A progress bar on stderr for sets of more than a few batches."""
    from tqdm import tqdm

    total = len(batches) if hasattr(batches, "__len__") else None
    return tqdm(batches, desc="eval", unit="batch", file=sys.stderr, total=total, disable=(total or 0) <= 3)
