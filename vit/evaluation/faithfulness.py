"""Is a map faithful? Deletion and insertion curves over the patch grid (Petsiuk, Das and Saenko, RISE, 2018).

Order the patches by a map, most relevant first. Deletion: replace them one step at a time with the baseline (0 after
Normalize: the dataset's mean colour) and follow the model's probability of the class; a map that finds the evidence
makes it fall fast (low area under the curve). Insertion: start from the all-baseline image and reveal them in the same
order; the probability should rise fast (high area). Five orders are compared: class-specific relevance, attention
rollout, the last block's attention, a centre prior, and random.

    scores = faithfulness(model, images)          # {"relevance": {"deletion": AUC, "insertion": AUC}, ...}
    vit-attention faithfulness --ckpt CKPT DIR [--json]   # vit/commands/attention.py
"""

import torch

from vit.evaluation.attention_maps import attention_rollout, image_relevance, readout, relevance
from vit.model.vision_transformer import VisionTransformer

MAPS = ("relevance", "rollout", "last_block", "center", "random")


def patch_scores(model: VisionTransformer, x: torch.Tensor, seed: int = 0) -> tuple[dict, torch.Tensor]:
    """Each map's score per patch, (B, N) each (higher = more relevant), and the class each image is judged on (the
    predicted one)."""
    rel, logits, attns = relevance(model, x)
    B, gh, gw = rel.shape
    p, distilled = model.num_prefix_tokens, model.dist_token is not None
    last = attns[-1].mean(dim=1)  # (B, T, T), heads averaged
    rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    dist = ((rows - (gh - 1) / 2) ** 2 + (cols - (gw - 1) / 2) ** 2).flatten().float()
    g = torch.Generator().manual_seed(seed)
    scores = {
        "relevance": rel.flatten(1),
        "rollout": image_relevance(attention_rollout(attns), p, (gh, gw), distilled).flatten(1),
        "last_block": readout(last, p, distilled),
        "center": (-dist).expand(B, -1).to(x.device),
        "random": torch.rand(B, gh * gw, generator=g).to(x.device),
    }
    return scores, logits.argmax(-1)


@torch.no_grad()
def curves(
    model: VisionTransformer,
    x: torch.Tensor,
    scores: torch.Tensor,
    classes: torch.Tensor,
    mode: str,
    steps: int | None = None,
    baseline: float = 0.0,
    chunk: int = 1024,
) -> torch.Tensor:
    """Probability of `classes` as patches are deleted (or inserted) in the order of `scores`: (B, S + 1), from no
    patch changed to every patch changed. S = N patches (at most 32 steps of equal size)."""
    B, C, H, W = x.shape
    patch = model.patch_embed.patch_size
    gh, gw = model.patch_embed.grid(x)
    N = gh * gw
    S = min(N, steps or 32)
    rank = scores.argsort(dim=1, descending=True).argsort(dim=1)  # (B, N): 0 for the most relevant patch
    counts = torch.linspace(0, N, S + 1).round().long().to(x.device)  # patches changed at each step
    changed = rank[:, None, :] < counts[None, :, None]  # (B, S + 1, N)
    if mode == "insertion":  # reveal in order: everything else is baseline
        changed = ~changed
    elif mode != "deletion":
        raise ValueError(f"mode={mode!r} is not 'deletion' or 'insertion'")
    mask = changed.view(B, S + 1, 1, gh, 1, gw, 1).expand(B, S + 1, 1, gh, patch, gw, patch).reshape(B, S + 1, 1, H, W)
    probs = []
    flat_x = x[:, None].expand(B, S + 1, C, H, W).reshape(-1, C, H, W)
    flat_mask = mask.reshape(-1, 1, H, W)
    flat_cls = classes[:, None].expand(B, S + 1).reshape(-1)
    for i in range(0, len(flat_x), chunk):
        xi = torch.where(flat_mask[i : i + chunk], baseline, flat_x[i : i + chunk])
        p = model(xi).float().softmax(-1)
        probs.append(p.gather(1, flat_cls[i : i + chunk, None])[:, 0])
    return torch.cat(probs).view(B, S + 1)


def auc(curve: torch.Tensor) -> torch.Tensor:
    """Area under each curve over [0, 1] (trapezoid): (B, S + 1) -> (B,)."""
    return torch.trapezoid(curve, dx=1.0 / (curve.shape[1] - 1), dim=1)


def faithfulness(model: VisionTransformer, x: torch.Tensor, batch: int = 128, seed: int = 0) -> dict:
    """Mean deletion and insertion AUC of every map over the images x (normalised, (B, C, H, W))."""
    model = model.eval()
    sums = {m: {"deletion": 0.0, "insertion": 0.0} for m in MAPS}
    for i in range(0, len(x), batch):
        xb = x[i : i + batch]
        scores, classes = patch_scores(model, xb, seed + i)
        for name in MAPS:
            for mode in ("deletion", "insertion"):
                sums[name][mode] += auc(curves(model, xb, scores[name], classes, mode)).sum().item()
    return {m: {k: v / len(x) for k, v in d.items()} for m, d in sums.items()}
