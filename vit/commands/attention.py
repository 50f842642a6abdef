"""`vit-attention`: where a trained model looks, for image files; and how faithful each map is.

    vit-attention --ckpt checkpoints/digits/version_0/last.ckpt --out maps/ img1.png img2.png
    vit-attention faithfulness --ckpt checkpoints/digits/version_0/last.ckpt images/ --format json

The first writes `<stem>_attention.png` per image (the image above its relevance overlay, as vit-predict draws it;
`--attention-map rollout` for the rollout; `<position>_<stem>_...` for a stem met before) and the per-head maps of the
last block (vit.evaluation.attention_maps); `faithfulness` prints the deletion/insertion table of
vit.evaluation.faithfulness.
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from torchvision.utils import save_image

from vit.commands.command_line import device_flag, model_flags
from vit.data.images import expand_inputs, read_or_report
from vit.data.transforms import eval_transform
from vit.deployment.predict import pick_device
from vit.evaluation.attention_maps import attention_panels, display_side, overlay_grid, relevance
from vit.evaluation.calibration import probabilities
from vit.evaluation.faithfulness import faithfulness
from vit.model.checkpoint import load_model_or_report


def build_parser() -> argparse.ArgumentParser:
    """The command line (the README's commands are checked against it)."""
    ap = argparse.ArgumentParser(prog="vit-attention", description=maps_main.__doc__)
    model_flags(ap)
    ap.add_argument("--out", "--output", dest="out", required=True, help="folder for the PNGs (created)")
    ap.add_argument(
        "--size",
        type=int,
        default=None,
        help="display size of each tile in pixels (default: twice the model's input side, 64-256)",
    )
    ap.add_argument(
        "--attention-map",
        dest="attention_map",
        choices=["relevance", "rollout"],
        default="relevance",
        help="relevance: where the evidence for the predicted class is (as vit-predict draws); rollout: where "
        "attention flows, for any class",
    )
    device_flag(ap)
    ap.add_argument("images", nargs="+", help="image files")
    return ap


def build_faithfulness_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vit-attention faithfulness", description=faithfulness_main.__doc__)
    model_flags(ap)
    ap.add_argument("folder", help="images (searched recursively)")
    ap.add_argument("--limit", type=int, default=500, help="at most this many images (sorted by path)")
    ap.add_argument("--format", choices=("table", "json"), default="table", help="output format (default table)")
    ap.add_argument("--json", dest="format", action="store_const", const="json", help=argparse.SUPPRESS)  # old name
    return ap


def maps_main(argv: list[str]) -> int:
    """Write `<stem>_attention.png` per image: the image above its relevance (or rollout) overlay, and the per-head
    maps of the last block."""
    args = build_parser().parse_args(argv)
    device = pick_device(args.device)
    loaded = load_model_or_report(args.ckpt)
    if loaded is None:
        return 2
    model, record = loaded
    model = model.to(device).eval()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tf = eval_transform(record.img_size, record.mean, record.std)
    size = args.size or display_side(record.img_size)
    names = record.class_names
    done, used = 0, set()
    for i, (path, x) in enumerate(read_or_report(args.images, tf, record.in_chans)):
        x = x[None].to(device)
        panels = attention_panels(model, x, record.mean, record.std, display_size=size)
        picture = panels["rollout"]  # the image above its rollout overlay
        if args.attention_map == "relevance":  # ... or above where the evidence for the predicted class is
            picture = overlay_grid(x, relevance(model, x)[0], record.mean, record.std, size)
        # the calibrated probability, as vit-predict, vit-eval and vit-serve print it
        prob, idx = probabilities(panels["logits"], record.temperature)[0].max(-1)
        # <stem>_...; a stem met before (a/x.png, b/x.png) takes its position first, as vit-predict's maps do
        stem = Path(path).stem if Path(path).stem not in used else f"{i:05d}_{Path(path).stem}"
        used.add(stem)
        target = out / f"{stem}_attention.png"
        save_image(picture, target)
        save_image(panels["layers"][-1], out / f"{stem}_heads_last_block.png")
        print(f"{target}  predicted {names[idx]} ({prob:.2f})")
        done += 1
    return 0 if done == len(args.images) else 1


def faithfulness_main(argv: list[str]) -> int:
    """Deletion and insertion AUC of five patch orders (relevance, rollout, last block, centre, random) over a folder
    of images: which map finds what the decision rests on."""
    args = build_faithfulness_parser().parse_args(argv)
    loaded = load_model_or_report(args.ckpt)
    if loaded is None:
        return 2
    model, record = loaded
    paths = expand_inputs([args.folder])[: args.limit]
    if not paths or not Path(args.folder).exists():
        print(f"error: {args.folder}: no images", file=sys.stderr)
        return 2
    tf = eval_transform(record.img_size, record.mean, record.std)
    images = [x for _, x in read_or_report(paths, tf, record.in_chans)]
    result = faithfulness(model, torch.stack(images))
    if args.format == "json":
        print(json.dumps(result, indent=2))
    else:
        print(f"{len(images)} images; deletion: lower is better, insertion: higher is better")
        print(f"{'map':12s} {'deletion':>9s} {'insertion':>9s}")
        for name, r in result.items():
            print(f"{name:12s} {r['deletion']:9.4f} {r['insertion']:9.4f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`faithfulness ...` as the first argument: the faithfulness table; otherwise overlays for image files."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["faithfulness"]:
        return faithfulness_main(argv[1:])
    return maps_main(argv)


if __name__ == "__main__":
    sys.exit(main())
