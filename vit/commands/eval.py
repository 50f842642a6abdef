"""`vit-eval` (or `python -m vit.commands.eval`): what a checkpoint gets right and wrong on a labelled set.

    vit-eval --ckpt checkpoints/folder/version_0/last.ckpt path/to/labelled --out eval/   # <class>/<image> folders
    vit-eval --ckpt last.ckpt --split val --out eval/          # the checkpoint's own validation split, as in training
    vit-eval --ckpt last.ckpt --split test --out eval/         # its data's test split (a test/ folder or test rows)
    vit-eval --ckpt last.ckpt torch/fashion_mnist --download-root data --out eval/  # a torchvision test split
    vit-eval --ckpt last.ckpt --split val --ood path/to/other_images --out eval/    # how well it says "unknown"

Writes into the --out folder: metrics.json, predictions.csv, per_class.csv, confusion_matrix.png, reliability.png,
top_losses.png and index.html (one self-contained page with all of them). Probabilities are the served ones
(calibrated by the checkpoint's temperature; --raw-probs: the softmax as it was), decoded and batched exactly as
vit-predict does. Exit status: 0 done, 1 done but some files were unreadable (listed on stderr), 2 usage error.
"""

import argparse
import csv
import json
import sys
from pathlib import Path

import torch

from vit.commands.command_line import device_flag, model_flags
from vit.data.base import whole_val_batches
from vit.data.device import DeviceBatches
from vit.data.images import expand_inputs
from vit.data.transforms import DataError
from vit.deployment.labelled import FileBatches, labelled_folder, training_data
from vit.deployment.predict import class_names, pick_device
from vit.evaluation.galleries import label_issue_gallery, top_losses
from vit.evaluation.ood_metrics import FeatureTap, ood_report, rejection_report
from vit.evaluation.report import (
    confusion_figure,
    metrics_of,
    png_bytes,
    prediction_rows,
    reliability_figure,
    report_html,
    score,
    write_per_class,
    write_predictions,
)
from vit.evaluation.tta import SymmetryTTA, tta_views
from vit.evaluation.unknown import features_of, record_scores
from vit.model.checkpoint import CheckpointError, load_checkpoint, load_model_or_report


def batches_for(args, ckpt: dict, hparams: dict, classes: list[str], device: torch.device):
    """(batches, ids_of(n): the names of the n images scored, known after the pass, the FileBatches or None, title)."""
    if args.split == "test":
        dm = training_data(args.ckpt, ckpt, hparams)
        if "test" not in (getattr(dm, "samples", None) or {}):
            raise DataError(f"{args.ckpt}: its training data has no test split (a test/ folder or test rows)")
        files, targets = zip(*dm.samples["test"])
        fb = FileBatches(list(files), list(targets), hparams, args.batch_size, args.num_workers, device)
        return fb, lambda n: [fb.files[i] for i in fb.kept], fb, "its test split"
    if args.split == "val":
        dm = training_data(args.ckpt, ckpt, hparams)
        if getattr(dm, "samples", None):  # a folder: its validation files
            files, targets = zip(*dm.samples["val"])
            fb = FileBatches(list(files), list(targets), hparams, args.batch_size, args.num_workers, device)
            return fb, lambda n: [fb.files[i] for i in fb.kept], fb, "its validation split"
        dm.setup("validate")
        batches = whole_val_batches(dm)
        return batches, lambda n: [f"val/{i:06d}" for i in range(n)], None, "its validation split"
    if args.data.startswith("torch/"):
        from vit.data.torchvision_data import eval_split

        x, y, names = eval_split(args.data, args.download_root, hparams["img_size"], hparams.get("in_chans", 3))
        if names and names != classes:
            raise DataError(f"{args.data}: its classes {names[:5]}... are not the checkpoint's {classes[:5]}...")
        batches = DeviceBatches(
            x, y, args.batch_size, hparams["mean"], hparams["std"], train=False, out_size=hparams["img_size"]
        )
        stem = args.data.removeprefix("torch/")
        return batches, lambda n: [f"torch/{stem}/test/{i:06d}" for i in range(n)], None, f"{args.data} (test)"
    files, targets = labelled_folder(Path(args.data), classes)
    fb = FileBatches(files, targets, hparams, args.batch_size, args.num_workers, device)
    return fb, lambda n: [fb.files[i] for i in fb.kept], fb, args.data


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="vit-eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    model_flags(ap)
    ap.add_argument("data", nargs="?", metavar="DATA", help="a folder of <class>/<image> files, or torch/<name>")
    ap.add_argument(
        "--split",
        choices=("val", "test"),
        help="the checkpoint's own validation split, as training had it; test: its data's test split",
    )
    ap.add_argument(
        "--out",
        "--output",
        dest="out",
        required=True,
        metavar="DIR",
        help="folder for the report (created; files replaced)",
    )
    # not --data-root: vit-train's --data.root is a folder of your images, this is where torchvision datasets lie
    ap.add_argument(
        "--download-root", default="data", help="where torch/<name> datasets are (default data; no download)"
    )
    ap.add_argument("--data-root", dest="download_root", help=argparse.SUPPRESS)  # the old spelling
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--num-workers", type=int, default=None, help="decoding workers (default as vit-predict)")
    device_flag(ap)
    ap.add_argument("--top-losses", type=int, default=16, help="how many of the worst images to show (1-25)")
    ap.add_argument("--raw-probs", action="store_true", help="the softmax as it was, without the fitted temperature")
    ap.add_argument(
        "--ood",
        metavar="DIR",
        help="a folder of images of none of the classes: AUROC and FPR at 95%% TPR of every unknown score against them",
    )
    ap.add_argument(
        "--tta",
        action="store_true",
        help="average the logits over the flips and quarter turns the model trained with (1 forward per view)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if (args.data is None) == (args.split is None):
        ap.error("give DATA (a folder or torch/<name>) or --split val|test, one of the two")
    if args.batch_size < 1 or not 1 <= args.top_losses <= 25:
        ap.error("--batch-size must be >= 1 and --top-losses within 1-25")
    loaded = load_model_or_report(args.ckpt)
    if loaded is None:
        return 2
    model, hparams = loaded
    classes = class_names(model, hparams)
    temperature = 1.0 if args.raw_probs else hparams.get("temperature", 1.0)
    device = pick_device(args.device)
    ckpt = load_checkpoint(args.ckpt)  # its records beside the weights: the training data, the label issues
    if hparams.get("task") == "multilabel":
        return eval_multilabel(args, model, hparams, ckpt, classes, device)
    tap = None if args.tta else FeatureTap(model)  # the pooled features of the same pass, for rejection
    scorer = SymmetryTTA(model, *tta_views(ckpt.get("data"))) if args.tta else tap
    try:
        batches, ids_of, files, title = batches_for(args, ckpt, hparams, classes, device)
        scored = score(scorer, progress(batches), device, temperature, worst=args.top_losses)
        outside = ood_scores(args, model, hparams, device) if args.ood else None
    except (DataError, CheckpointError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    ids = ids_of(len(scored.targets))
    rows = prediction_rows(scored.logits, scored.targets, temperature)
    metrics = metrics_of(rows, classes, temperature)
    metrics["skipped"] = [{"path": p, "error": e} for p, e in (files.errors if files else [])]
    record = hparams.get("unknown")
    feats, inputs = (torch.cat(tap.feats), torch.cat(tap.inputs)) if tap is not None else (None, None)
    if tap is not None and record is not None:
        metrics["unknown"] = rejection_report(scored.logits, feats, inputs, scored.targets, record, classes)
    if outside is not None:
        inside = record_scores(record, scored.logits, feats, inputs)
        outside_scores, outside_logits = outside
        metrics["ood"] = ood_report(inside, outside_scores, record, outside_logits)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    write_predictions(out / "predictions.csv", ids, rows, classes)
    write_per_class(out / "per_class.csv", metrics)
    figures = {
        "confusion_matrix.png": png_bytes(confusion_figure(torch.tensor(metrics["confusion_matrix"]), classes)),
        "reliability.png": png_bytes(reliability_figure(rows, metrics)),
        "top_losses.png": top_losses(model, scored, rows, classes, hparams, device, ids),
    }
    gallery = label_issue_gallery(ckpt, hparams)
    if gallery is not None:
        figures["label_issues.png"], metrics["label_issues"] = gallery[0], gallery[1]
        (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    for name, data in figures.items():
        (out / name).write_bytes(data)
    page = report_html(metrics, figures, f"{Path(args.ckpt).name} on {title}")
    (out / "index.html").write_text(page, encoding="utf-8")
    top1, balanced = 100 * metrics["top1"], 100 * metrics["balanced_accuracy"]
    print(
        f"{metrics['n']} images: top-1 {top1:.2f}%, balanced {balanced:.2f}%,"
        f" macro F1 {metrics['f1_macro']:.4f}, ECE {metrics['ece']:.4f} (raw {metrics['ece_uncalibrated']:.4f})"
    )
    print(unknown_lines(metrics) + f"report: {out / 'index.html'}")
    return 1 if metrics["skipped"] else 0


def eval_multilabel(args, model, hparams: dict, ckpt: dict, classes: list[str], device) -> int:
    """A multi-label model on its own validation or test split: mAP and F1 at the stored thresholds beside the
    per-label majority baseline (metrics.json, per_label.csv, predictions.csv, index.html)."""
    from vit.evaluation.calibration import logits_of
    from vit.evaluation.multilabel import multilabel_report, report_page

    if args.split is None or args.ood or args.tta:
        print(
            "error: a multi-label model is scored on --split val or --split test (its labels file), without "
            "--ood or --tta",
            file=sys.stderr,
        )
        return 2
    try:
        dm = training_data(args.ckpt, ckpt, hparams)
        if args.split not in dm.samples:
            raise DataError(f"{args.ckpt}: its training data has no {args.split} split")
        items = dm.samples[args.split]
        fb = FileBatches(
            [p for p, _ in items], dm.targets_of(items), hparams, args.batch_size, args.num_workers, device
        )
        logits, targets = logits_of(model, progress(fb), device)
    except (DataError, CheckpointError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    probs = logits.sigmoid()
    share = dm.targets_of(dm.samples["train"]).mean(0)  # (C,) training images carrying each label
    metrics = multilabel_report(probs, targets, hparams["thresholds"], share, classes)
    metrics["skipped"] = [{"path": p, "error": e} for p, e in fb.errors]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    with open(out / "per_label.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(metrics["per_label"][0]))
        w.writeheader()
        w.writerows(metrics["per_label"])
    with open(out / "predictions.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "labels", "true", *[f"prob_{c}" for c in classes]])
        given = probs >= torch.tensor(hparams["thresholds"])
        for i, k in enumerate(fb.kept):
            names = lambda row: ";".join(c for c, on in zip(classes, row) if on)  # noqa: E731
            w.writerow([fb.files[k], names(given[i]), names(targets[i] > 0.5), *[f"{p:.4f}" for p in probs[i]]])
    (out / "index.html").write_text(report_page(metrics, f"{Path(args.ckpt).name} on its {args.split} split"))
    base = metrics["baseline"]
    print(
        f"{metrics['n']} images: mAP {metrics['mAP']:.4f}, F1 macro {metrics['f1_macro']:.4f}, micro "
        f"{metrics['f1_micro']:.4f} (per-label majority: mAP {base['mAP']:.4f}, F1 macro {base['f1_macro']:.4f}, "
        f"micro {base['f1_micro']:.4f})\nreport: {out / 'index.html'}"
    )
    return 1 if metrics["skipped"] else 0


def ood_scores(args, model, hparams: dict, device) -> dict:
    """Every score that the checkpoint allows on the images of --ood DIR (any layout: none of them is of a class), and
    their logits."""
    files = expand_inputs([args.ood])
    if not files:
        raise DataError(f"--ood {args.ood}: no image files there")
    fb = FileBatches(files, [0] * len(files), hparams, args.batch_size, args.num_workers, device)
    feats, logits, _, inputs = features_of(model, progress(fb), device)
    return record_scores(hparams.get("unknown"), logits, feats, inputs), logits


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


if __name__ == "__main__":
    sys.exit(main())
