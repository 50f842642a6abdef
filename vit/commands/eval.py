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
import json
import sys
from pathlib import Path

import torch

from vit.commands.command_line import device_flag, model_flags
from vit.data.transforms import DataError
from vit.deployment.evaluate import EvalSet, batches_for, evaluate_multilabel, ood_scores, progress, unknown_lines
from vit.deployment.predict import pick_device
from vit.evaluation.confusion_image import confusion_image, png
from vit.evaluation.galleries import label_issue_gallery, top_losses
from vit.evaluation.ood_metrics import FeatureTap, ood_report, rejection_report
from vit.evaluation.report import (
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
from vit.evaluation.unknown import record_scores
from vit.model.checkpoint import CheckpointError, load_model_or_report


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
    model, record = loaded
    source = EvalSet(args.ckpt, args.data, args.split, args.download_root, args.batch_size, args.num_workers)
    classes = list(record.class_names)
    temperature = 1.0 if args.raw_probs else record.temperature
    device = pick_device(args.device)
    if record.multilabel:
        return eval_multilabel(args, source, model, record, device)
    tap = None if args.tta else FeatureTap(model)  # the pooled features of the same pass, for rejection
    scorer = SymmetryTTA(model, *tta_views(record.data)) if args.tta else tap
    try:
        batches, ids_of, files, title = batches_for(source, record, device)
        scored = score(scorer, progress(batches), device, temperature, worst=args.top_losses)
        outside = ood_scores(args.ood, source, model, record, device) if args.ood else None
    except (DataError, CheckpointError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    ids = ids_of(len(scored.targets))
    rows = prediction_rows(scored.logits, scored.targets, temperature)
    metrics = metrics_of(rows, classes, temperature)
    metrics["skipped"] = [{"path": p, "error": e} for p, e in (files.errors if files else [])]
    feats, inputs = (torch.cat(tap.feats), torch.cat(tap.inputs)) if tap is not None else (None, None)
    if tap is not None and record.unknown is not None:
        metrics["unknown"] = rejection_report(scored.logits, feats, inputs, scored.targets, record.unknown, classes)
    if outside is not None:
        inside = record_scores(record.unknown, scored.logits, feats, inputs)
        outside_scores, outside_logits = outside
        metrics["ood"] = ood_report(inside, outside_scores, record.unknown, outside_logits)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    write_predictions(out / "predictions.csv", ids, rows, classes)
    write_per_class(out / "per_class.csv", metrics)
    figures = {
        "confusion_matrix.png": png(confusion_image(torch.tensor(metrics["confusion_matrix"]), classes)),
        "reliability.png": png_bytes(reliability_figure(rows, metrics)),
        "top_losses.png": top_losses(model, scored, rows, classes, record, device, ids),
    }
    gallery = label_issue_gallery(record)
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


def eval_multilabel(args, source: EvalSet, model, record, device) -> int:
    """vit-eval of a multi-label model (vit/deployment/evaluate.py evaluate_multilabel): its one line, or an error."""
    if args.split is None or args.ood or args.tta:
        print(
            "error: a multi-label model is scored on --split val or --split test (its labels file), without "
            "--ood or --tta",
            file=sys.stderr,
        )
        return 2
    try:
        metrics = evaluate_multilabel(source, model, record, device, Path(args.out))
    except (DataError, CheckpointError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    base = metrics["baseline"]
    print(
        f"{metrics['n']} images: mAP {metrics['mAP']:.4f}, F1 macro {metrics['f1_macro']:.4f}, micro "
        f"{metrics['f1_micro']:.4f} (per-label majority: mAP {base['mAP']:.4f}, F1 macro {base['f1_macro']:.4f}, "
        f"micro {base['f1_micro']:.4f})\nreport: {Path(args.out) / 'index.html'}"
    )
    return 1 if metrics["skipped"] else 0


if __name__ == "__main__":
    sys.exit(main())
