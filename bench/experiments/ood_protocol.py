"""Leave-one-kind-out: which unknown score holds on a kind of outlier that played no part in choosing it.

    python bench/experiments/ood_protocol.py OUT.json \
        --model clothing CKPT test=clothing_test near=clothing_near digits=digits/val cells=cells_cv/test0 \
        --model digits CKPT test=digits_test near=digits_near clothing=clothing_test cells=cells_cv/test0 ...

Each --model names a checkpoint that holds its rejection record (fit writes it) and folders of images: `test=` a
labelled <class>/<image> folder of the model's own classes that no part of training saw, every other KIND=DIR a folder
of outliers (any layout; `near` for classes held out of training). Six more kinds are made from the test images
themselves, at the model's input size: blurred, downsampled 4x and upsampled (lowres), noised, contrast-inverted, a
corner cropped and enlarged, and constant (one random grey level per image). Every image is decoded and normalised as
vit-predict does; the model's validation split (the one its thresholds were set on) is rebuilt from its record.

For every candidate score (each of vit/evaluation/unknown.py's, and sums of two of them, each standardised by its
mean and spread on the validation images), the AUROC of the test images against each kind. The choice: the candidate
whose worst (model, kind) margin over its target (0.90 far, 0.80 near) is largest; leave-one-kind-out makes that
choice once per kind without it, and the figure that counts for a kind is the chosen candidate's AUROC on it. The
forward passes are cached beside OUT (OUT.cache.pt), so the choice can be rerun without the models.
"""

import argparse
import itertools
import json
import math
import sys
import tempfile
from pathlib import Path

import torch
import torchvision.transforms.v2.functional as TF
from torch.utils.data import DataLoader

from vit.data.images import expand_inputs
from vit.deployment.labelled import labelled_folder, training_data
from vit.deployment.predict import ImageFiles, channel_stats, collate, normalize
from vit.evaluation.image_features import features_of
from vit.evaluation.ood_metrics import auroc
from vit.evaluation.unknown import (
    MIN_CLASS_IMAGES,
    class_thresholds,
    fused_score,
    fusion_of,
    record_scores,
    reject_threshold,
    thresholds_of,
    unknown_scores,
)
from vit.model.checkpoint import load_checkpoint, model_of

sys.path.insert(0, str(Path(__file__).parent))
from ood_pairs import with_statistics  # noqa: E402

SYNTHETIC = ("blur", "lowres", "noise", "invert", "corner", "blank")
TARGET = {"near": 0.80}  # every other kind: far
FAR_TARGET = 0.90


def synthetic(kind: str, x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """uint8 (B, C, H, W) test images -> the same batch made into outliers of `kind`."""
    h, w = x.shape[-2:]
    if kind == "blur":
        sigma = h / 14  # 2 px at 28 px: strokes and edges gone, the layout kept
        k = 2 * math.ceil(3 * sigma) + 1
        return TF.gaussian_blur(x, [k, k], [sigma, sigma])
    if kind == "lowres":
        small = TF.resize(x, [max(1, h // 4), max(1, w // 4)], antialias=True)
        return TF.resize(small, [h, w], antialias=False)
    if kind == "noise":
        noise = torch.randn(x.shape, generator=gen) * 0.3 * 255
        return (x.float() + noise).clamp(0, 255).to(torch.uint8)
    if kind == "invert":
        return 255 - x
    if kind == "corner":
        return TF.resize(x[..., : h // 2, : w // 2], [h, w], antialias=True)
    if kind == "blank":
        level = torch.randint(0, 256, (len(x), 1, 1, 1), generator=gen, dtype=torch.uint8)
        return level.expand_as(x).clone()
    raise ValueError(kind)


@torch.no_grad()
def outputs_of(model, hparams: dict, files: list[str], kind: str | None = None) -> tuple:
    """Pooled features (N, L + 1, D), logits (N, C) and input statistics (N, 5) of image files, read as vit-predict
    reads them; `kind`: made into that synthetic outlier first."""
    loader = DataLoader(ImageFiles(files, hparams.img_size, hparams.in_chans), batch_size=256,
                        num_workers=1, collate_fn=collate)  # fmt: skip
    mean, std = channel_stats(hparams, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    batches = []
    for x, _, _ in loader:
        if kind is not None:
            x = synthetic(kind, x, gen)
        batches.append((normalize(x, mean, std), torch.zeros(len(x), dtype=torch.long)))
    feats, logits, _, inputs = features_of(model, batches, torch.device("cpu"))
    return feats, logits, inputs


def model_outputs(name: str, ckpt_path: str, folders: dict[str, str], limit: int) -> dict:
    """{set: (feats, logits, pixel statistics[, targets])} for the validation split, the test folder and every kind of
    outliers, with the record fit makes today (its statistics) and the class names."""
    with tempfile.TemporaryDirectory() as tmp:  # the record as fit makes it today, on a copy
        ckpt_path = str(with_statistics(Path(ckpt_path), Path(tmp)))
        ckpt = load_checkpoint(ckpt_path)
    model, hparams = model_of(ckpt, ckpt_path)
    classes = hparams.class_names
    dm = training_data(ckpt_path, ckpt, hparams)
    files, targets = zip(*dm.samples["val"])
    out = {"val": (*outputs_of(model, hparams, list(files)), torch.tensor(targets))}
    files, targets = labelled_folder(Path(folders.pop("test")), classes)
    out["test"] = (*outputs_of(model, hparams, files), torch.tensor(targets))
    pick = torch.randperm(len(files), generator=torch.Generator().manual_seed(0))[:limit].tolist()
    for kind in SYNTHETIC:
        out[kind] = outputs_of(model, hparams, [files[i] for i in pick], kind)
    for kind, folder in folders.items():
        found = expand_inputs([folder])
        found = [found[i] for i in torch.randperm(len(found), generator=torch.Generator().manual_seed(0))[:limit]]
        out[kind] = outputs_of(model, hparams, found)
    print(f"{name}: {', '.join(f'{k} {len(v[1])}' for k, v in out.items())}", flush=True)
    return {"outputs": out, "stats": hparams.unknown["stats"], "classes": classes}


def base_scores(entry: dict) -> dict[str, dict[str, torch.Tensor]]:
    """{set: {score: (N,)}} of every score unknown.py knows, on every set of one model."""
    return {s: unknown_scores(o[1], o[0], entry["stats"], inputs=o[2]) for s, o in entry["outputs"].items()}


def with_fusions(scores: dict[str, dict[str, torch.Tensor]]) -> dict[str, dict[str, torch.Tensor]]:
    """Every pair and triple of base scores summed after standardising each by its mean and spread on the validation
    set."""
    names = ["+".join(parts) for n in (2, 3) for parts in itertools.combinations(sorted(scores["val"]), n)]
    fusions = {name: fusion_of(scores["val"], name) for name in names}
    return {s: {**by, **{name: fused_score(by, name, f) for name, f in fusions.items()}} for s, by in scores.items()}


def aurocs(scores: dict[str, dict[str, torch.Tensor]]) -> dict[str, dict[str, float]]:
    """{kind: {candidate: AUROC of test against the kind}}."""
    test = scores["test"]
    return {
        kind: {c: auroc(test[c], by[c]) for c in test} for kind, by in scores.items() if kind not in ("val", "test")
    }


def choose(table: dict[str, dict[str, dict[str, float]]], leave_out: str | None) -> tuple[str, float]:
    """The candidate with the largest worst margin over the targets, on every (model, kind) but `leave_out`."""
    candidates = next(iter(next(iter(table.values())).values())).keys()
    best, best_margin = None, -math.inf
    for c in candidates:
        margins = [by[c] - TARGET.get(kind, FAR_TARGET) for kinds in table.values() for kind, by in kinds.items()
                   if kind != leave_out]  # fmt: skip
        if min(margins) > best_margin:
            best, best_margin = c, min(margins)
    return best, best_margin


def rejection(entry: dict, name: str) -> dict:
    """The record fit would write for score `name` (its fusion and thresholds from the validation set, per predicted
    class where a class has MIN_CLASS_IMAGES of them), and what it does: the share of each true class of the
    validation and test images it calls unknown (classes with at least MIN_CLASS_IMAGES images; the shared threshold's
    too, for comparison), and the share of each outlier kind."""
    out = entry["outputs"]
    val = unknown_scores(out["val"][1], out["val"][0], entry["stats"], inputs=out["val"][2])
    record = {"score": name, "stats": entry["stats"]}
    if "+" in name:
        record["fusion"] = fusion_of(val, name)
    scores = {s: record_scores(record, o[1], o[0], o[2])[name] for s, o in out.items()}
    logits = out["val"][1]
    record["threshold"] = reject_threshold(scores["val"])
    record["class_thresholds"] = class_thresholds(scores["val"], logits.argmax(-1), len(entry["classes"]))
    shared = {**record, "class_thresholds": None}
    by_label = {**record, "class_thresholds": class_thresholds(scores["val"], out["val"][3], len(entry["classes"]))}

    def per_class(s: str, rec: dict) -> dict:
        lost = scores[s] < thresholds_of(rec, out[s][1])
        targets = out[s][3]
        return {entry["classes"][c]: float(lost[targets == c].double().mean())
                for c in range(len(entry["classes"])) if (targets == c).sum() >= MIN_CLASS_IMAGES}  # fmt: skip

    kinds = [k for k in out if k not in ("val", "test")]
    return {
        "own_thresholds": sum(t is not None for t in record["class_thresholds"]),
        "val_lost_per_class": per_class("val", record),
        "test_lost_per_class": per_class("test", record),
        "test_lost_per_class_shared": per_class("test", shared),
        "val_lost_per_class_by_label": per_class("val", by_label),
        "test_lost_per_class_by_label": per_class("test", by_label),
        "unknown_share": {k: float((scores[k] < thresholds_of(record, out[k][1])).double().mean()) for k in kinds},
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--model", nargs="+", action="append", required=True, metavar="NAME CKPT KIND=DIR")
    p.add_argument("--limit", type=int, default=1000, help="outlier images per kind")
    a = p.parse_args()
    cache = Path(a.out + ".cache.pt")
    entries = torch.load(cache, weights_only=False) if cache.exists() else {}
    for name, ckpt, *specs in a.model:
        if name not in entries:
            entries[name] = model_outputs(name, ckpt, dict(s.split("=", 1) for s in specs), a.limit)
            torch.save(entries, cache)
    scores = {name: with_fusions(base_scores(e)) for name, e in entries.items()}
    table = {name: aurocs(s) for name, s in scores.items()}
    kinds = sorted({k for t in table.values() for k in t})
    chosen, margin = choose(table, None)
    loko = {k: choose(table, k)[0] for k in kinds}
    result = {
        "chosen": chosen,
        "margin": margin,
        "leave_one_kind_out": {
            k: {"chosen": c, "auroc": {m: t[k][c] for m, t in table.items() if k in t}} for k, c in loko.items()
        },
        "table": table,
    }
    result["rejection"] = {name: rejection(e, chosen) for name, e in entries.items()}
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(f"chosen on every kind: {chosen} (worst margin {margin:+.3f})")
    for k, c in loko.items():
        print(f"  without {k:8s}: {c:40s} " + "  ".join(f"{m} {t[k][c]:.3f}" for m, t in table.items() if k in t))
    for name, r in result["rejection"].items():
        worst = {
            s: max(r[s].items(), key=lambda kv: kv[1]) for s in r if s.endswith("per_class") or s.endswith("shared")
        }
        print(
            f"{name}: {r['own_thresholds']} classes with their own threshold; worst class lost "
            + ", ".join(f"{s} {c} {100 * v:.1f}%" for s, (c, v) in worst.items())
        )
        print("   called unknown: " + "  ".join(f"{k} {100 * v:.0f}%" for k, v in r["unknown_share"].items()))


if __name__ == "__main__":
    main()
