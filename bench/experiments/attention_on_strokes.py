"""Do the attention maps of a digits model mean something? How much relevance falls on the strokes.

    python bench/experiments/attention_on_strokes.py --ckpt checkpoints/digits/version_0/best-epoch033.ckpt

A patch is "stroke" when the mean ink of its pixels is >= 0.5 (with patch 8 on the 32 px digits, upscaled from 8x8,
a patch covers 2x2 pixels of the original digit; with patch 4, one). For each map we report the share of its mass on
stroke patches and the ratio of that share to the area strokes cover (the lift: 1 = no preference).
An image-agnostic prior (the average relevance map over all images) is the control: a map that only favours the
centre, where digits are, gets a lift from that alone.
"""

import argparse

import torch

from vit.data.digits import DigitsDataModule
from vit.evaluation.attention_maps import attention_received, attention_rollout, capture_attention, image_relevance
from vit.model.checkpoint import load_model


def lift(maps: torch.Tensor, stroke: torch.Tensor) -> tuple[float, float, float]:
    """maps, stroke: (B, N). Mean share of mass on strokes, mean stroke area, and the ratio of the two."""
    maps = maps / maps.sum(-1, keepdim=True)
    mass = (maps * stroke).sum(-1).mean().item()
    area = stroke.float().mean(-1).mean().item()
    return mass, area, mass / area


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True)
    args = ap.parse_args()
    model, hp = load_model(args.ckpt)
    p, size = model.cfg.patch_size, model.cfg.img_size
    dm = DigitsDataModule(img_size=size)
    x = torch.stack([dm.val_set[i][0] for i in range(len(dm.val_set))])
    g = size // p
    ink = dm.val_set.images[:, 0].float().reshape(-1, g, p, g, p).mean((2, 4)).flatten(1) / 255  # (B, N) in [0, 1]
    stroke = ink >= 0.5
    with torch.no_grad():
        attns, logits = capture_attention(model, x)
    acc = (logits.argmax(-1) == dm.val_set.targets).float().mean().item()
    grid = model.grid_size
    rows = {"rollout (heads mean, +I, all queries)": image_relevance(attention_rollout(attns), 0, grid).flatten(1)}
    for i, a in enumerate(attns):
        rows[f"block {i}: attention received (heads mean)"] = attention_received(a, 0, grid).mean(1).flatten(1)
    last = attention_received(attns[-1], 0, grid)  # (B, H, gh, gw)
    for h in range(last.shape[1]):
        rows[f"block {len(attns) - 1}, head {h}: attention received"] = last[:, h].flatten(1)
    raw = None
    for a in attns:  # rollout without the residual identity: the raw product of attention matrices
        m = a.mean(1)
        raw = m if raw is None else m @ raw
    rows["product of attentions (no +I)"] = raw.mean(1)
    print(
        f"{len(x)} validation digits, accuracy {acc:.4f}; strokes (ink >= 0.5) cover "
        f"{stroke.float().mean():.1%} of the patches"
    )
    print(f"{'map':46s} {'mass on strokes':>16s} {'lift':>6s} {'control lift':>13s} {'max/min':>8s}")
    for name, maps in rows.items():
        mass, _, ratio = lift(maps, stroke)
        # control: the same map averaged over all images (image-agnostic: only a centre prior)
        _, _, control = lift(maps.mean(0, keepdim=True).expand_as(maps), stroke)
        spread = (maps.max(-1).values / maps.min(-1).values.clamp_min(1e-9)).median().item()
        print(f"{name:46s} {mass:16.1%} {ratio:6.2f} {control:13.2f} {spread:8.1f}")


if __name__ == "__main__":
    main()
