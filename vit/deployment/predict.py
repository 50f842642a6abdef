"""Classify image files with a trained model: the library behind `vit-predict` and `vit-serve`.

    model, record = load_model("checkpoints/digits")        # vit.model.checkpoint
    records = predict(model, paths, record, topk=3)   # [{'path', 'predictions': [...], 'unknown', 'error'}]
    logits = model(normalize(uint8_batch, record.mean, record.std))

Preprocessing (image size, channels, mean, std) comes from the checkpoint's record (vit/model/record.py), through
vit.data.images: the same decode as training. The command line is vit/commands/predict.py.
"""

import os
import re
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from vit.data.images import convert_image, describe, image_at, read_image, same_dtype
from vit.data.transforms import normalize_uint8, uint8_affine
from vit.evaluation.attention_maps import (
    attention_rollout,
    capture_attention,
    denormalize,
    image_relevance,
    overlay,
    relevance,
)
from vit.evaluation.calibration import probabilities
from vit.evaluation.unknown import Rejector
from vit.model.record import CheckpointRecord


class ImageFiles(Dataset):
    """(uint8 image tensor or None, index, error or None) per path; decoding runs in the DataLoader's workers.

    Workers only decode, resize and crop (uint8: 4x less to pass between processes); the scaling and normalisation
    happen once per batch in `normalize`. Same numbers, 3x less work per image than doing it all per image (measured
    with bench/predict_speed.py).
    """

    def __init__(self, paths: list[str], img_size: int, in_chans: int = 3):
        self.paths, self.img_size, self.in_chans = paths, img_size, in_chans

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        try:
            return image_at(read_image(self.paths[i], self.in_chans), self.img_size), i, None
        except Exception as e:  # every failure becomes a record; one bad file must not stop the rest
            return None, i, describe(e)


def normalize(x: torch.Tensor, mean, std) -> torch.Tensor:
    """uint8 (B, C, H, W) -> float, scaled to [0, 1] and normalised, as ToDtype(scale=True) + Normalize. `mean`
    and `std`: (C,) float32 tensors on x's device (channel_stats: made once, not uploaded again per batch), or lists."""
    return normalize_uint8(x, *uint8_affine(mean, std, x.device))  # training's own, to the last bit


def channel_stats(record: CheckpointRecord, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The checkpoint's mean and std as (C,) float32 tensors on the device, for normalize."""
    return tuple(torch.tensor(v, dtype=torch.float32, device=device) for v in (record.mean, record.std))


def collate(items):
    good = [(x, i) for x, i, err in items if err is None]
    x = torch.stack(same_dtype([x for x, _ in good])) if good else None  # 8-bit beside 16-bit files: all float
    return x, [i for _, i in good], [(i, err) for _, i, err in items if err is not None]


def pick_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cuda' without a GPU is a one-line error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: no CUDA device is available")
    return torch.device(name)


def top_k(logits: torch.Tensor, names: list[str], k: int, temperature: float = 1.0) -> list[list[dict]]:
    """(B, num_classes) logits -> per image the k most probable classes: [{'label', 'prob'}], most probable first,
    with the probabilities softmax(logits / temperature) (vit.evaluation.calibration; 1.0: the raw softmax)."""
    probs, top = probabilities(logits, temperature).topk(min(k, len(names)), dim=-1)
    return [
        [{"label": names[t], "prob": round(p, 6)} for p, t in zip(p_row, t_row)]
        for p_row, t_row in zip(probs.cpu().tolist(), top.cpu().tolist())
    ]


def labels_above(logits: torch.Tensor, names: list[str], k: int, thresholds: list[float]) -> tuple[list, list]:
    """A multi-label model's (B, C) logits -> per image the k most probable labels [{'label', 'prob'}] (each label's
    own sigmoid probability: they need not sum to 1), and the labels at or above their thresholds, likeliest first."""
    probs = logits.float().sigmoid()
    given = probs >= torch.tensor(thresholds, device=probs.device)
    order = probs.argsort(dim=-1, descending=True).cpu().tolist()
    probs, given = probs.cpu().tolist(), given.cpu().tolist()
    top = [[{"label": names[c], "prob": round(p[c], 6)} for c in o[:k]] for p, o in zip(probs, order)]
    return top, [[names[c] for c in o if g[c]] for g, o in zip(given, order)]


def map_and_logits(model, x: torch.Tensor, kind: str = "relevance") -> tuple[torch.Tensor, torch.Tensor]:
    """(B, gh, gw) map over the patch grid and the logits of the same forward: class-specific relevance of the
    predicted class, or the attention rollout."""
    if kind == "relevance":
        rel, logits, _ = relevance(model, x)
        return rel, logits
    attns, logits = capture_attention(model, x)
    grid = model.patch_embed.grid(x)
    rel = image_relevance(attention_rollout(attns), model.num_prefix_tokens, grid, model.dist_token is not None)
    return rel, logits


def overlays(x: torch.Tensor, maps: torch.Tensor, record: CheckpointRecord) -> torch.Tensor:
    """Normalised inputs and their maps -> (B, 3, H, 2W) float in [0, 1]: each image beside its overlay."""
    images = denormalize(x.float(), record.mean, record.std).cpu()
    return torch.stack([torch.cat([img, overlay(img, m)], dim=-1) for img, m in zip(images, maps.cpu())])


def label_maps(model, x, logits, record: CheckpointRecord, paths: list[str], idx: list[int], out) -> None:
    """A multi-label model's relevance map of every label at or above its threshold, one PNG per (image, label):
    `<position>_<stem>_<label>.png` beside the map of its likeliest label. One forward and backward per label."""
    from torchvision.utils import save_image

    names = record.class_names
    above = logits.float().sigmoid() >= torch.tensor(record.thresholds, device=logits.device)  # (B, C)
    for c in above.any(0).nonzero().flatten().tolist():
        rows = above[:, c].nonzero().flatten()
        rel = relevance(model, x[rows], c)[0]  # (n, gh, gw): the relevance of label c
        label = re.sub(r"[^\w.-]", "_", names[c])  # a file name, whatever the label says
        for r, picture in zip(rows.tolist(), overlays(x[rows], rel, record)):
            save_image(picture, Path(out) / f"{idx[r]:05d}_{Path(paths[r]).stem}_{label}.png")


def classify(model, images: list, record: CheckpointRecord, topk: int = 5) -> list[dict]:
    """PIL images in memory -> one record each, as vit-predict writes them: {'predictions': [{'label', 'prob'}],
    'unknown'} (a multi-label model's add 'labels'); the checkpoint's preprocessing, temperature and rejection.

        model, record = load_model("checkpoints/digits")   # vit.model.checkpoint: a run's best checkpoint
        classify(model, [Image.open("digit.png")], record, topk=3)
    """
    dev = next(model.parameters()).device
    side = record.img_size
    x = torch.stack(same_dtype([image_at(convert_image(img, record.in_chans), side) for img in images])).to(dev)
    x = normalize(x, *channel_stats(record, dev))
    reject, names = Rejector(record.unknown), record.class_names
    with torch.inference_mode():
        logits, feats = reject.forward(model.eval(), x)
    unknown = reject(logits, feats, reject.inputs(x)).tolist()
    if record.multilabel:
        top, given = labels_above(logits, names, topk, record.thresholds)
        return [{"predictions": p, "labels": g, "unknown": None} for p, g in zip(top, given)]
    top = top_k(logits, names, topk, record.temperature)
    return [{"predictions": p, "unknown": u} for p, u in zip(top, unknown)]


def predict(
    model,
    paths: list[str],
    record: CheckpointRecord,
    topk: int = 5,
    batch_size: int = 64,
    device: str = "auto",
    num_workers: int | None = None,
    attention_out: str | None = None,
    progress: bool = True,
    attention_map: str = "relevance",
    raw_probs: bool = False,
) -> list[dict]:
    """Classify image files: one record per path, in order: {'path', 'predictions': [{'label', 'prob'}], 'unknown',
    'error'}; a multi-label model's records add 'labels', every label at or above its threshold (labels_above).
    With `attention_out`, also an overlay PNG per image there (`attention_map`: relevance or rollout). Probabilities
    are calibrated by the checkpoint's temperature (record.temperature) unless `raw_probs`."""
    from torchvision.utils import save_image
    from tqdm import tqdm

    dev = pick_device(device)
    model = model.to(dev).eval()
    names = record.class_names
    if num_workers is None:
        # Leave a core to the forward: on 2 cores one decoding worker measured faster than two.
        num_workers = max(1, min(4, (os.cpu_count() or 2) - 1)) if len(paths) > batch_size else 0
    loader = DataLoader(
        ImageFiles(paths, record.img_size, record.in_chans),
        batch_size=batch_size,
        num_workers=num_workers,
        collate_fn=collate,
        pin_memory=dev.type == "cuda",
    )
    # "unknown": the image scores below the checkpoint's rejection threshold (vit/evaluation/unknown.py); a checkpoint
    # without one never says so
    records: list[dict] = [{"path": p, "predictions": [], "unknown": None, "error": None} for p in paths]
    reject = Rejector(record.unknown)
    if attention_out:
        Path(attention_out).mkdir(parents=True, exist_ok=True)
    bar = tqdm(loader, desc="predict", unit="batch", file=sys.stderr, disable=not progress or len(loader) <= 3)
    mean, std = channel_stats(record, dev)
    temperature = 1.0 if raw_probs else record.temperature
    with torch.inference_mode():  # relevance() leaves it for its own backward
        for x, idx, errors in bar:
            for i, err in errors:
                records[i]["error"] = err
                print(f"{paths[i]}: error: {err}", file=sys.stderr)
            if x is None:
                continue
            x = normalize(x.to(dev, non_blocking=True), mean, std)
            if attention_out:
                maps, logits = map_and_logits(model, x, attention_map)
                for i, picture in zip(idx, overlays(x, maps, record)):
                    save_image(picture, Path(attention_out) / f"{i:05d}_{Path(paths[i]).stem}.png")
                if record.multilabel and attention_map == "relevance":
                    label_maps(model, x, logits, record, [paths[i] for i in idx], idx, attention_out)
                feats = reject.forward(model, x)[1]  # a second forward only when the score needs the features
            else:
                logits, feats = reject.forward(model, x)
            unknown = reject(logits, feats, reject.inputs(x)).tolist()
            if record.multilabel:  # several labels an image: every one above its threshold
                top, given = labels_above(logits, names, topk, record.thresholds)
                for i, preds, labels in zip(idx, top, given):
                    records[i]["predictions"], records[i]["labels"] = preds, labels
                continue
            for i, preds, u in zip(idx, top_k(logits, names, topk, temperature), unknown):
                records[i]["predictions"], records[i]["unknown"] = preds, u
    return records
