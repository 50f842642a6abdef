"""Overlays of each map side by side for a few images: columns image, relevance (predicted class), rollout, last
block's attention; one row per image. For docs/attention.md.

    python bench/experiments/maps_side_by_side.py --ckpt CKPT --out docs/maps_digits.png img1.png img2.png ...
"""

import argparse
import sys
from pathlib import Path

import torch
from torchvision.utils import make_grid, save_image

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from vit.data.images import read_image
from vit.data.transforms import eval_transform
from vit.evaluation.attention_maps import denormalize, overlay_batch, resize_tiles  # noqa: E402
from vit.evaluation.faithfulness import patch_scores  # noqa: E402
from vit.model.checkpoint import load_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", type=int, default=96)
    ap.add_argument("images", nargs="+")
    args = ap.parse_args()
    model, hp = load_model(args.ckpt)
    tf = eval_transform(hp.img_size, hp.mean, hp.std)
    x = torch.stack([tf(read_image(p))[: hp.in_chans] for p in args.images])
    scores, classes = patch_scores(model, x)
    grid = model.grid_size
    images = resize_tiles(denormalize(x, hp.mean, hp.std), args.size)
    columns = [images] + [
        overlay_batch(images, scores[name].view(-1, *grid)) for name in ("relevance", "rollout", "last_block")
    ]
    tiles = torch.stack(columns, dim=1).flatten(0, 1)  # row per image: image, relevance, rollout, last block
    save_image(make_grid(tiles, nrow=len(columns), padding=2, pad_value=1.0), args.out)
    names = hp.class_names
    print(f"wrote {args.out}; predicted: {[names[c] for c in classes.tolist()]}")


if __name__ == "__main__":
    main()
