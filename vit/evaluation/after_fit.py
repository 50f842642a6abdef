"""What `vit-train fit` does with its best and last checkpoints once training ends, on the validation set (rank zero):
post-hoc logit adjustment for a long-tailed folder; then, in one read and one write of each file, the calibration
temperature and the rejection record; the chosen checkpoint's accuracy, balanced accuracy and confusion matrix. The
command prints the lines these return."""

import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torchmetrics.functional.classification import multiclass_confusion_matrix

from vit.data.base import ImageClassificationData, whole_train_batches, whole_val_batches
from vit.evaluation.calibration import calibration_report, fit_temperature
from vit.evaluation.logit_adjustment import adjust_checkpoints
from vit.evaluation.map_callback import add_png
from vit.evaluation.report import confusion_figure, figure_pixels
from vit.evaluation.scores import balanced_accuracy
from vit.evaluation.unknown import (
    ACCEPT,
    DEFAULT_SCORE,
    block_scale,
    feature_stats,
    features_of,
    reject_threshold,
    unknown_scores,
)


def adjust_after_fit(paths: list[str], dm: ImageClassificationData, device: torch.device) -> str | None:
    """Post-hoc logit adjustment of the checkpoints (the best first), before the temperature is fitted on the
    adjusted logits (vit/evaluation/logit_adjustment.py)."""
    counts = dm.class_counts()
    if counts is None:
        return None  # a source whose class counts are not known (a stream): nothing to adjust for
    best = adjust_checkpoints(paths, whole_val_batches(dm), counts, device)[paths[0]]
    return (
        f"logit adjustment: tau {best['tau']:g}, balanced accuracy {best['balanced_accuracy_before']:.4f} -> "
        f"{best['balanced_accuracy']:.4f} on the validation set it was chosen on (folded into the head's bias)"
    )


def measure_after_fit(paths: list[str], dm: ImageClassificationData, device: torch.device) -> dict[str, dict]:
    """The calibration temperature and the rejection record of each checkpoint (the best first), stored in the file
    under "calibration" and "unknown" (rewritten atomically): each file is read once and written once, and each
    distinct weights pass once over the validation images (which the temperature and the thresholds both read) and
    once over the training images (the rejection statistics); best and last of a run that ended on its best epoch hold
    the same weights and get the same measurement. Returns {path: {"calibration", "unknown", "logits", "targets"}}."""
    from vit.model.checkpoint import load_checkpoint, model_of
    from vit.training.checkpoint_io import AtomicCheckpointIO

    train = whole_train_batches(dm)
    measured, done = {}, []  # done: (state_dict, measurement) of the weights already measured
    for path in dict.fromkeys(paths):
        ckpt = load_checkpoint(path)
        model, _ = model_of(ckpt, path)
        state = model.state_dict()
        found = next((m for seen, m in done if _same_weights(seen, state)), None)
        if found is None:
            val = features_of(model, whole_val_batches(dm), device)  # (N, L + 1, D), (N, C), (N,)
            _, logits, targets = val
            found = {
                "calibration": calibration_report(logits, targets, fit_temperature(logits, targets)),
                "unknown": _unknown_record(model, train, dm, device, val),
                "logits": logits,
                "targets": targets,
            }
            done.append((state, found))
        ckpt["calibration"], ckpt["unknown"] = found["calibration"], found["unknown"]
        AtomicCheckpointIO().save_checkpoint(ckpt, path)
        measured[path] = found
    return measured


def calibration_lines(best: dict, dm: ImageClassificationData, tb: TensorBoardLogger | None, step: int) -> str:
    """What fit prints of the best checkpoint's measurement (measure_after_fit): its temperature, and its accuracy and
    balanced accuracy on the validation set; to TensorBoard (when there is one) its calibration and confusion matrix
    under eval/."""
    report, logits, targets = best["calibration"], best["logits"], best["targets"]
    pred = logits.argmax(-1)
    cm = multiclass_confusion_matrix(pred, targets, dm.num_classes)
    recall = cm.diag().double() / cm.sum(dim=1).clamp(min=1)  # (C,): 0 for a class without images
    lines = (
        f"calibrated: temperature {report['temperature']:.3f}, ECE {report['ece_uncalibrated']:.4f} -> "
        f"{report['ece']:.4f} on the validation set it was fitted on (vit-predict and vit-serve apply it; "
        "--raw-probs: without)\n"
        # both, whichever chose the checkpoint: what a long-tail rule traded is visible
        f"chosen checkpoint on the validation set: accuracy {float((pred == targets).double().mean()):.4f}, "
        f"balanced accuracy {balanced_accuracy(pred, targets, dm.num_classes):.4f}"
    )
    if tb is not None:
        writer = tb.experiment
        for key in ("ece", "ece_uncalibrated", "temperature", "nll", "nll_uncalibrated"):
            writer.add_scalar(f"eval/{key}", report[key], step)
        add_png(writer, "eval/confusion_matrix", figure_pixels(confusion_figure(cm, list(dm.class_names))), step)
        for name, r in zip(dm.class_names, recall.tolist()):
            writer.add_scalar(f"eval/acc_per_class/{name}", r, step)
        writer.flush()
    return lines


def unknown_line(best: dict) -> str:
    """What fit prints of the best checkpoint's rejection record (measure_after_fit)."""
    record = best["unknown"]
    return (
        f"unknown: {record['score']} below its threshold says 'unknown' (set on the validation images to accept at "
        f"least {ACCEPT:.0%} of images like them); {len(record['thresholds'])} scores stored for vit-eval --ood"
    )


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _unknown_record(model, train, dm: ImageClassificationData, device: torch.device, val: tuple) -> dict:
    """One model's rejection record: the pooled features' statistics on the training images (no augmentation), every
    score's threshold from its validation outputs `val` (features, logits, targets), so that at most 1 - ACCEPT of new
    images like them is rejected (never from the training ones, which the model has fitted); vit-predict, vit-serve,
    vit-eval and the ONNX sidecar apply the DEFAULT_SCORE's (vit/evaluation/unknown.py)."""
    stats = None
    if train is not None:
        feats, _, targets = features_of(model, train, device)
        stats = feature_stats(feats, targets, dm.num_classes)
    feats, logits, _ = val
    if stats is not None:
        stats = block_scale(stats, feats)
    scores = unknown_scores(logits, feats, stats)
    thresholds = {name: reject_threshold(s) for name, s in scores.items()}
    score = DEFAULT_SCORE if DEFAULT_SCORE in thresholds else "energy"
    return {"score": score, "threshold": thresholds[score], "accept": ACCEPT, "thresholds": thresholds,
            "stats": stats or {}}  # fmt: skip
