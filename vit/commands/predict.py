"""`vit-predict` (or `python predict.py`): classify image files with a checkpoint.

    vit-predict --ckpt checkpoints/digits/version_0/last.ckpt --format json some/folder
    vit-predict --ckpt model.ckpt --topk 3 img1.jpg 'photos/**/*.png' --output results.csv --format csv
    vit-predict --onnx vit-int8.onnx some/folder      # an exported model (vit-export), with its sidecar's preprocessing

Preprocessing (image size, mean, std, channels) comes from the checkpoint alone. An image unlike the training data
(its score below the threshold stored after training: vit/evaluation/unknown.py) is `unknown` (JSON, CSV column) and
shown as UNKNOWN in the table, with its nearest classes. Bad files are reported on stderr and
in the `error` field, and the other images are still classified. Exit status: 0 all classified, 1 some failed,
2 usage error (bad checkpoint, no input matched).
"""

import argparse
import csv
import io
import json
import sys
from pathlib import Path

from vit.commands.command_line import device_flag, model_flags
from vit.data.images import expand_inputs
from vit.deployment.onnx_model import OnnxError, load_onnx
from vit.deployment.predict import predict
from vit.model.checkpoint import load_model_or_report

FORMATS = ("table", "json", "csv")


def format_records(records: list[dict], fmt: str, topk: int) -> str:
    """Render records as an aligned table, one JSON document, or CSV with a header row."""
    if fmt == "json":
        return json.dumps(records, indent=2) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        multi = any("labels" in rec for rec in records)  # a multi-label model: the labels given, ';'-separated
        head = ["path", *(["labels"] if multi else [])]
        head += [*[f"{c}{r}" for r in range(1, topk + 1) for c in ("label", "prob")], "unknown", "error"]
        w.writerow(head)
        for rec in records:
            cells = [v for p in rec["predictions"] for v in (p["label"], f"{p['prob']:.4f}")]
            unknown = "" if rec["unknown"] is None else str(rec["unknown"]).lower()
            given = [";".join(rec.get("labels") or [])] if multi else []
            w.writerow([rec["path"], *given, *cells, *[""] * (2 * topk - len(cells)), unknown, rec["error"] or ""])
        return buf.getvalue()
    width = max([len("path"), *(len(r["path"]) for r in records)])
    lines = [f"{'path':<{width}}  predictions"]
    for rec in records:
        preds = "  ".join(f"{p['label']} {p['prob']:.3f}" for p in rec["predictions"])
        preds = f"UNKNOWN (nearest: {preds})" if rec["unknown"] else preds
        if "labels" in rec:  # a multi-label model: the labels given, then each top label's own probability
            preds = f"[{', '.join(rec['labels']) or 'none'}]  {preds}"
        lines.append(f"{rec['path']:<{width}}  {preds if rec['error'] is None else 'ERROR: ' + rec['error']}")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    """The command line (the README's commands are checked against it)."""
    ap = argparse.ArgumentParser(
        prog="vit-predict", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    model_flags(ap, onnx_help="a model exported by vit-export (int8 or not), its FILE.json beside it; CPU")
    ap.add_argument("--topk", type=int, default=5, help="how many classes per image (default 5)")
    ap.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    ap.add_argument("--out", "--output", dest="output", help="write the results to this file instead of stdout")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument(
        "--num-workers", type=int, default=None, help="decoding workers (default: cores - 1, at most 4, when batched)"
    )
    device_flag(ap)
    ap.add_argument("--attention-out", metavar="DIR", help="also write an overlay PNG per image: where the model looks")
    ap.add_argument(
        "--attention-map",
        choices=("relevance", "rollout"),
        default="relevance",
        help="relevance: class-specific, for the predicted class (default); rollout: attention rollout",
    )
    ap.add_argument(
        "--raw-probs",
        action="store_true",
        help="the model's softmax as it is, without the calibration temperature fitted after training",
    )
    ap.add_argument("inputs", nargs="+", metavar="INPUT", help="image files, folders (recursive) or globs")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.topk < 1 or args.batch_size < 1:
        ap.error("--topk and --batch-size must be >= 1")
    if args.onnx and args.attention_out:
        ap.error("--attention-out needs the torch model (--ckpt): an ONNX graph has no attention to read")
    if args.onnx:
        try:
            model, hparams = load_onnx(args.onnx)
        except OnnxError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        args.device = "cpu"
    else:
        loaded = load_model_or_report(args.ckpt)
        if loaded is None:
            return 2
        model, hparams = loaded
    paths = expand_inputs(args.inputs)
    if not paths:
        print(f"error: no image matched {' '.join(args.inputs)}", file=sys.stderr)
        return 2
    records = predict(
        model,
        paths,
        hparams,
        topk=args.topk,
        batch_size=args.batch_size,
        device=args.device,
        num_workers=args.num_workers,
        attention_out=args.attention_out,
        attention_map=args.attention_map,
        raw_probs=args.raw_probs,
    )
    text = format_records(records, args.format, min(args.topk, model.num_classes))
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 1 if any(r["error"] for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
