"""What `vit-train fit` does with its best and last checkpoints once training ends, on the validation set (rank zero):
post-hoc logit adjustment for a long-tailed folder, then the calibration temperature, and the chosen checkpoint's
accuracy, balanced accuracy and confusion matrix. Each returns the lines the command prints."""

import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torchmetrics.functional.classification import multiclass_confusion_matrix

from vit.data.base import ImageClassificationData, whole_train_batches, whole_val_batches
from vit.evaluation.calibration import calibrate_checkpoints
from vit.evaluation.logit_adjustment import adjust_checkpoints
from vit.evaluation.report import confusion_figure
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


def validation_outputs(paths: list[str], dm: ImageClassificationData, device: torch.device) -> dict[str, tuple]:
    """{path: (pooled features (N, L + 1, D), logits (N, C), targets (N,))} of each checkpoint on the validation set,
    one pass per distinct weights (best and last of a run that ended on its best epoch hold the same): the
    temperature and the rejection thresholds both read them."""
    from vit.model.checkpoint import load_model

    outputs, done = {}, []  # done: (state_dict, outputs) of the weights already passed
    for path in dict.fromkeys(paths):
        model, _ = load_model(path)
        state = model.state_dict()
        found = next((out for seen, out in done if _same_weights(seen, state)), None)
        outputs[path] = found or features_of(model, whole_val_batches(dm), device)
        if found is None:
            done.append((state, outputs[path]))
    return outputs


def calibrate_after_fit(
    outputs: dict[str, tuple], dm: ImageClassificationData, tb: TensorBoardLogger | None, step: int
) -> str:
    """A temperature for each checkpoint (the best first), fitted on its validation outputs (validation_outputs;
    vit/evaluation/calibration.py); the best one's accuracy and balanced accuracy, and to TensorBoard (when there is
    one) its calibration and confusion matrix under eval/."""
    best = calibrate_checkpoints({path: (logits, targets) for path, (_, logits, targets) in outputs.items()})
    best = best[next(iter(outputs))]
    _, logits, targets = next(iter(outputs.values()))
    pred = logits.argmax(-1)
    cm = multiclass_confusion_matrix(pred, targets, dm.num_classes)
    recall = cm.diag().double() / cm.sum(dim=1).clamp(min=1)  # (C,): 0 for a class without images
    lines = (
        f"calibrated: temperature {best['temperature']:.3f}, ECE {best['ece_uncalibrated']:.4f} -> "
        f"{best['ece']:.4f} on the validation set it was fitted on (vit-predict and vit-serve apply it; "
        "--raw-probs: without)\n"
        # both, whichever chose the checkpoint: what a long-tail rule traded is visible
        f"chosen checkpoint on the validation set: accuracy {float((pred == targets).double().mean()):.4f}, "
        f"balanced accuracy {balanced_accuracy(pred, targets, dm.num_classes):.4f}"
    )
    if tb is not None:
        writer = tb.experiment
        for key in ("ece", "ece_uncalibrated", "temperature", "nll", "nll_uncalibrated"):
            writer.add_scalar(f"eval/{key}", best[key], step)
        writer.add_figure("eval/confusion_matrix", confusion_figure(cm, list(dm.class_names)), step)
        for name, r in zip(dm.class_names, recall.tolist()):
            writer.add_scalar(f"eval/acc_per_class/{name}", r, step)
        writer.flush()
    return lines


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _unknown_record(model, train, dm: ImageClassificationData, device: torch.device, val: tuple | None) -> dict:
    """One model's rejection record: statistics of the training features, every score's threshold on validation
    (`val`: its validation outputs, or None to pass over the validation set here)."""
    stats = None
    if train is not None:
        feats, _, targets = features_of(model, train, device)
        stats = feature_stats(feats, targets, dm.num_classes)
    feats, logits, _ = val or features_of(model, whole_val_batches(dm), device)
    if stats is not None:
        stats = block_scale(stats, feats)
    scores = unknown_scores(logits, feats, stats)
    thresholds = {name: reject_threshold(s) for name, s in scores.items()}
    score = DEFAULT_SCORE if DEFAULT_SCORE in thresholds else "energy"
    return {"score": score, "threshold": thresholds[score], "accept": ACCEPT, "thresholds": thresholds,
            "stats": stats or {}}  # fmt: skip


def unknown_after_fit(
    paths: list[str], dm: ImageClassificationData, device: torch.device, outputs: dict[str, tuple] | None = None
) -> str:
    """Rejection for each checkpoint (the best first): the pooled features' statistics on the training images (no
    augmentation), every score's threshold from the validation images, so that at most 1 - ACCEPT of new images like
    them is rejected (never from the training ones, which the model has fitted), stored in the file under "unknown";
    vit-predict, vit-serve, vit-eval and the ONNX sidecar apply the DEFAULT_SCORE's (vit/evaluation/unknown.py).
    `outputs`: the checkpoints' validation outputs (validation_outputs), if already passed."""
    from vit.model.checkpoint import load_checkpoint, load_model
    from vit.training.checkpoint_io import AtomicCheckpointIO

    train = whole_train_batches(dm)
    chosen, done = [], []  # done: (state_dict, record) of the files already measured
    for path in dict.fromkeys(paths):  # best and last can be the same file
        model, _ = load_model(path)
        state = model.state_dict()
        # best and last of a run that ended on its best epoch hold the same weights: the same record, measured once
        record = next((r for seen, r in done if _same_weights(seen, state)), None)
        if record is None:
            record = _unknown_record(model, train, dm, device, (outputs or {}).get(path))
            done.append((state, record))
        ckpt = load_checkpoint(path)
        ckpt["unknown"] = record
        AtomicCheckpointIO().save_checkpoint(ckpt, path)
        chosen.append((record["score"], len(record["thresholds"])))
    return (
        f"unknown: {chosen[0][0]} below its threshold says 'unknown' (set on the validation images to accept at least "
        f"{ACCEPT:.0%} of images like them); {chosen[0][1]} scores stored for vit-eval --ood"
    )
