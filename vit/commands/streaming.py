"""`python -m vit.commands.streaming optimize ROOT OUT`: an image folder (root/train/<class>/* and root/val/<class>/*,
or root/<class>/*, of which 20% of each class goes to val, seeded) converted once to litdata chunks, with the class
names and the training images' mean/std beside them (vit.data.streaming); then `python train.py --config
configs/streaming.yaml --data.init_args.input_dir OUT`."""

import argparse
import sys

from vit.data.streaming import META, optimize_folder
from vit.data.transforms import DataError


def build_parser() -> argparse.ArgumentParser:
    """The command line (the README's commands are checked against it)."""
    ap = argparse.ArgumentParser(prog="python -m vit.commands.streaming", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    opt = sub.add_parser("optimize", help="convert root/train and root/val (or root/<class>/) to litdata chunks")
    opt.add_argument("root")
    opt.add_argument("output_dir")
    opt.add_argument("--num-workers", type=int, default=1)
    opt.add_argument("--chunk-bytes", default="64MB")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        meta = optimize_folder(args.root, args.output_dir, args.num_workers, args.chunk_bytes)
    except (DataError, ValueError, OSError) as e:  # a folder that cannot be read: one line, nothing written
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.output_dir}/train, {args.output_dir}/val and {META}: {len(meta['class_names'])} classes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
