"""Classify image files with a checkpoint.

    python predict.py --ckpt checkpoints/digits/version_0/last.ckpt --format json some/folder
    vit-predict --ckpt model.ckpt --topk 3 img1.jpg 'photos/**/*.png' --output results.csv --format csv

Preprocessing (image size, mean, std, RGB) comes from the checkpoint alone. Bad files are reported on stderr and in
the `error` field, and the other images are still classified. Exit status: 0 all classified, 1 some failed,
2 usage error (bad checkpoint, no input matched).
"""

import argparse
import csv
import glob
import io
import json
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.datasets.folder import IMG_EXTENSIONS
from torchvision.transforms.v2.functional import pil_to_tensor

from vit.checkpoint import load_model_or_report
from vit.data import describe, eval_geometry, read_image

FORMATS = ("table", "json", "csv")


def expand_inputs(inputs: list[str]) -> list[str]:
    """Files as given, folders searched recursively for image extensions, globs expanded (`**` too), in order.
    A path that exists nowhere is kept, so that it is reported as an error rather than silently dropped."""
    paths: list[str] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = sorted(str(f) for f in p.rglob("*") if f.suffix.lower() in IMG_EXTENSIONS and not f.is_dir())
            paths.extend(found)
        elif p.exists() or p.is_symlink():
            paths.append(item)
        elif glob.has_magic(item):
            paths.extend(sorted(f for f in glob.glob(item, recursive=True) if not os.path.isdir(f)))
        else:
            paths.append(item)
    return list(dict.fromkeys(paths))  # no duplicates, order kept


class ImageFiles(Dataset):
    """(uint8 image tensor or None, index, error or None) per path; decoding runs in the DataLoader's workers.

    Workers only decode, resize and crop (uint8: 4x less to pass between processes); the scaling and normalisation of
    `eval_transform` happen once per batch in `normalize`. Same numbers, 3x less work per image than doing it all
    per image (measured with bench/predict_speed.py).
    """

    def __init__(self, paths: list[str], img_size: int):
        self.paths, self.img_size, self.geometry = paths, img_size, eval_geometry(img_size)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        try:
            img = read_image(self.paths[i])
            if img.size == (self.img_size, self.img_size):  # already the model's size: resize and crop are identity
                return pil_to_tensor(img), i, None
            return self.geometry(img), i, None
        except Exception as e:  # every failure becomes a record; one bad file must not stop the rest
            return None, i, describe(e)


def normalize(x: torch.Tensor, mean, std) -> torch.Tensor:
    """uint8 (B, C, H, W) -> float, scaled to [0, 1] and normalised, as ToDtype(scale=True) + Normalize."""
    mean = torch.as_tensor(mean, dtype=torch.float32, device=x.device)[:, None, None]
    std = torch.as_tensor(std, dtype=torch.float32, device=x.device)[:, None, None]
    return (x.float() / 255 - mean) / std


def collate(items):
    good = [(x, i) for x, i, err in items if err is None]
    x = torch.stack([x for x, _ in good]) if good else None
    return x, [i for _, i in good], [(i, err) for _, i, err in items if err is not None]


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: no CUDA device is available")
    return torch.device(name)


def predict(
    model,
    paths: list[str],
    hparams: dict,
    topk: int = 5,
    batch_size: int = 64,
    device: str = "auto",
    num_workers: int | None = None,
    attention_out: str | None = None,
    progress: bool = True,
    attention_map: str = "relevance",
) -> list[dict]:
    """Classify image files: one record per path, in order: {'path', 'predictions': [{'label', 'prob'}], 'error'}."""
    from tqdm import tqdm

    dev = pick_device(device)
    model = model.to(dev).eval()
    names = hparams.get("class_names") or [str(i) for i in range(model.num_classes)]
    k = min(topk, len(names))
    if num_workers is None:
        # Leave a core to the forward: on 2 cores one decoding worker measured faster than two.
        num_workers = max(1, min(4, (os.cpu_count() or 2) - 1)) if len(paths) > batch_size else 0
    loader = DataLoader(
        ImageFiles(paths, hparams["img_size"]),
        batch_size=batch_size,
        num_workers=num_workers,
        collate_fn=collate,
        pin_memory=dev.type == "cuda",
    )
    records: list[dict] = [{"path": p, "predictions": [], "error": None} for p in paths]
    if attention_out:
        Path(attention_out).mkdir(parents=True, exist_ok=True)
    bar = tqdm(loader, desc="predict", unit="batch", file=sys.stderr, disable=not progress or len(loader) <= 3)
    with torch.inference_mode():
        for x, idx, errors in bar:
            for i, err in errors:
                records[i]["error"] = err
                print(f"{paths[i]}: error: {err}", file=sys.stderr)
            if x is None:
                continue
            x = normalize(x.to(dev, non_blocking=True), hparams["mean"], hparams["std"])
            if attention_out:
                logits = _write_attention(model, x, [paths[i] for i in idx], idx, hparams, attention_out, attention_map)
            else:
                logits = model(x)
            probs, top = logits.float().softmax(-1).topk(k, dim=-1)
            for i, p_row, t_row in zip(idx, probs.cpu().tolist(), top.cpu().tolist()):
                records[i]["predictions"] = [{"label": names[t], "prob": round(p, 6)} for p, t in zip(p_row, t_row)]
    return records


def _write_attention(model, x, paths, idx, hparams, out: str, kind: str = "relevance") -> torch.Tensor:
    """Overlay PNG per image (vit.attention_maps): class-specific relevance of the predicted class (default), or
    the attention rollout; returns the logits of the same forward."""
    from torchvision.utils import save_image

    from vit.attention_maps import (
        attention_rollout,
        capture_attention,
        denormalize,
        image_relevance,
        overlay,
        relevance,
    )

    if kind == "relevance":
        rel, logits, _ = relevance(model, x)
    else:
        attns, logits = capture_attention(model, x)
        patch = model.patch_embed.patch_size
        rel = image_relevance(
            attention_rollout(attns), model.num_prefix_tokens, (x.shape[-2] // patch, x.shape[-1] // patch)
        )
    images = denormalize(x.float(), hparams["mean"], hparams["std"]).cpu()
    for i, path, img, r in zip(idx, paths, images, rel):
        save_image(torch.cat([img, overlay(img, r)], dim=-1), Path(out) / f"{i:05d}_{Path(path).stem}.png")
    return logits


def format_records(records: list[dict], fmt: str, topk: int) -> str:
    """Render records as an aligned table, one JSON document, or CSV with a header row."""
    if fmt == "json":
        return json.dumps(records, indent=2) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["path", *[f"{c}{r}" for r in range(1, topk + 1) for c in ("label", "prob")], "error"])
        for rec in records:
            cells = [v for p in rec["predictions"] for v in (p["label"], f"{p['prob']:.4f}")]
            w.writerow([rec["path"], *cells, *[""] * (2 * topk - len(cells)), rec["error"] or ""])
        return buf.getvalue()
    width = max([len("path"), *(len(r["path"]) for r in records)])
    lines = [f"{'path':<{width}}  predictions"]
    for rec in records:
        preds = "  ".join(f"{p['label']} {p['prob']:.3f}" for p in rec["predictions"])
        lines.append(f"{rec['path']:<{width}}  {preds if rec['error'] is None else 'ERROR: ' + rec['error']}")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    """The command line (the README's commands are checked against it)."""
    ap = argparse.ArgumentParser(
        prog="vit-predict", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ckpt", required=True, help="checkpoint written by train.py (loaded as data, never as code)")
    ap.add_argument("--topk", type=int, default=5, help="how many classes per image (default 5)")
    ap.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    ap.add_argument("--output", help="write the results to this file instead of stdout")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument(
        "--num-workers", type=int, default=None, help="decoding workers (default: cores - 1, at most 4, when batched)"
    )
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--attention-out", metavar="DIR", help="also write an overlay PNG per image: where the model looks")
    ap.add_argument(
        "--attention-map",
        choices=("relevance", "rollout"),
        default="relevance",
        help="relevance: class-specific, for the predicted class (default); rollout: attention rollout",
    )
    ap.add_argument("inputs", nargs="+", metavar="INPUT", help="image files, folders (recursive) or globs")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.topk < 1 or args.batch_size < 1:
        ap.error("--topk and --batch-size must be >= 1")
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
    )
    text = format_records(records, args.format, min(args.topk, model.num_classes))
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 1 if any(r["error"] for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
