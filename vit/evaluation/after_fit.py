"""What `vit-train fit` does with its best and last checkpoints once training ends, on the validation set (rank zero):
post-hoc logit adjustment for a long-tailed folder; then, in one read and one write of each file, the calibration
temperature and the rejection record; the chosen checkpoint's accuracy, balanced accuracy and confusion matrix. The
command prints the lines these return."""

import time
from collections.abc import Iterator
from pathlib import Path

import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torchmetrics.functional.classification import multiclass_confusion_matrix

from vit.data.base import ImageClassificationData, whole_train_batches, whole_val_batches
from vit.evaluation.calibration import calibration_report, fit_temperature, probabilities
from vit.evaluation.confusion_image import confusion_image, pixels
from vit.evaluation.image_features import features_of
from vit.evaluation.logit_adjustment import BOOTSTRAPS, GATE, adjust_checkpoints
from vit.evaluation.map_callback import add_png
from vit.evaluation.scores import balanced_accuracy
from vit.evaluation.unknown import ACCEPT, rejection_record
from vit.model.checkpoint import unknown_of

# The training images read for the rejection statistics after fit: at most TRAIN_IMAGES, an equal share of each class
# (vit/data/base.py by_class_sample), and no more than the run trained on (at least TRAIN_FLOOR): their class means and
# covariances need a few hundred images a class, not a whole CIFAR. The validation images are all read, once for each
# distinct checkpoint, unless the run trained on fewer images than the validation set holds: then at most that many,
# and at least VAL_FLOOR, by class (a smoke run of 3 steps is not worth a pass over 10,000 images). 3 steps on
# CIFAR-format files (10,000 training, 2,000 validation images; docs/performance.md): 80 s after fit reading all of
# them, 18 s with the training bound alone.
TRAIN_IMAGES, TRAIN_FLOOR, VAL_FLOOR = 2048, 256, 1000


def after_fit_lines(
    saved: list[str],
    dm: ImageClassificationData,
    hparams,
    device: torch.device,
    tb: TensorBoardLogger | None,
    step: int,
) -> Iterator[str]:
    """What `vit-train fit` does with its saved checkpoints (the best first) once training ends, in order, each step's
    line as it is done, ending with the seconds it took: a multi-label model's thresholds; otherwise post-hoc logit
    adjustment where the run asked for it, then in one pass the temperature and the rejection record, and what they
    measured; last, the data's test split scored once with the best checkpoint (test_metrics.json beside the logs).
    The loaders of these passes over the validation set are freed at the end, whatever happened."""
    last = time.perf_counter()
    try:
        for line in _after_fit_steps(saved, dm, hparams, device, tb, step):
            yield f"{line} [{time.perf_counter() - last:.1f} s]"
            last = time.perf_counter()
    finally:
        dm.teardown("validate")


def _after_fit_steps(
    saved: list[str],
    dm: ImageClassificationData,
    hparams,
    device: torch.device,
    tb: TensorBoardLogger | None,
    step: int,
) -> Iterator[str]:
    if hparams.task == "multilabel":  # no temperature, rejection or adjustment: each reads a softmax
        yield multilabel_after_fit(saved, dm, device, tb, step)
    else:
        if hparams.posthoc_logit_adjust and (line := adjust_after_fit(saved, dm, device)):
            yield line
        trained = step * getattr(dm, "batch_size", 0) or None  # images the run trained on (None: not known)
        best = measure_after_fit(saved, dm, device, trained)[saved[0]]
        yield calibration_lines(best, dm, tb, step)
        if line := soft_label_line(best, dm, tb, step):
            yield line
        yield unknown_line(best)
    out = Path(tb.log_dir if tb is not None else Path(saved[0]).parent, "test_metrics.json")
    if line := test_after_fit(saved[0], dm, device, tb, step, out):
        yield line


def adjust_after_fit(paths: list[str], dm: ImageClassificationData, device: torch.device) -> str | None:
    """Post-hoc logit adjustment of the checkpoints (the best first), before the temperature is fitted on the
    adjusted logits (vit/evaluation/logit_adjustment.py)."""
    counts = dm.class_counts()
    if counts is None:
        return None  # a source whose class counts are not known (a stream): nothing to adjust for
    best = adjust_checkpoints(paths, whole_val_batches(dm), counts, device)[paths[0]]
    line = (
        f"logit adjustment: tau {best['tau']:g}, balanced accuracy {best['balanced_accuracy_before']:.4f} -> "
        f"{best['balanced_accuracy']:.4f} on the validation set it was chosen on"
    )
    if not best["tau_fit"]:
        return line + " (no tau helped)"
    share = f"{100 * best['bootstrap_wins']:.0f}%"
    wins = f"tau {best['tau_fit']:g} was better in {share} of {BOOTSTRAPS:,} bootstrap resamples"
    if best["tau"]:
        return line + f" ({wins}; folded into the head's bias)"
    return line + f" ({wins}, below {100 * GATE:.0f}%: within the validation set's noise, not applied)"


def measure_after_fit(
    paths: list[str], dm: ImageClassificationData, device: torch.device, trained: int | None = None
) -> dict[str, dict]:
    """The calibration temperature and the rejection record of each checkpoint (the best first), stored in the file
    under "calibration" and "unknown" (rewritten atomically): each file is read once and written once, and each
    distinct weights pass once over the validation images (which the temperature and the thresholds both read) and
    once over a bounded sample of the training images (the rejection statistics: TRAIN_IMAGES, and no more than the
    `trained` images the run trained on); best and last of a run that ended on its best epoch hold
    the same weights and get the same measurement. Returns {path: {"calibration", "unknown", "logits", "targets"}}."""
    from vit.model.checkpoint import load_checkpoint, model_of
    from vit.training.checkpoint_io import AtomicCheckpointIO

    limit = TRAIN_IMAGES if trained is None else min(TRAIN_IMAGES, max(TRAIN_FLOOR, trained))
    train = whole_train_batches(dm, limit=limit)
    val_limit = None if trained is None else max(VAL_FLOOR, trained)
    measured, done = {}, []  # done: (state_dict, measurement) of the weights already measured
    for path in dict.fromkeys(paths):
        ckpt = load_checkpoint(path)
        state = ckpt["state_dict"]  # compared as saved: weights measured already build no model
        found = next((m for seen, m in done if _same_weights(seen, state)), None)
        if found is None:
            model, _ = model_of(ckpt, path)
            val = features_of(
                model, whole_val_batches(dm, limit=val_limit), device
            )  # (N, L + 1, D), (N, C), (N,), (N, 5)
            _, logits, targets, _ = val
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
    held = getattr(dm, "memory", None) or {}
    total = len(held["val"][1]) if "val" in held else len(targets)
    where = "the validation set" if len(targets) >= total else f"{len(targets)} of the {total} validation images"
    lines = (
        f"calibrated: temperature {report['temperature']:.3f}, ECE {report['ece_uncalibrated']:.4f} -> "
        f"{report['ece']:.4f} on {where} it was fitted on (vit-predict and vit-serve apply it; "
        "--raw-probs: without)\n"
        # both, whichever chose the checkpoint: what a long-tail rule traded is visible
        f"chosen checkpoint on {where}: accuracy {float((pred == targets).double().mean()):.4f}, "
        f"balanced accuracy {balanced_accuracy(pred, targets, dm.num_classes):.4f}"
    )
    if tb is not None:
        writer = tb.experiment
        for key in ("ece", "ece_uncalibrated", "temperature", "nll", "nll_uncalibrated"):
            writer.add_scalar(f"eval/{key}", report[key], step)
        add_png(writer, "eval/confusion_matrix", pixels(confusion_image(cm, list(dm.class_names))), step)
        for name, r in zip(dm.class_names, recall.tolist()):
            writer.add_scalar(f"eval/acc_per_class/{name}", r, step)
        writer.flush()
    return lines


def soft_label_line(best: dict, dm: ImageClassificationData, tb: TensorBoardLogger | None, step: int) -> str | None:
    """Where the labels were probabilities (soft labels): the chosen checkpoint's calibrated probabilities against
    them on the validation images, as the Brier score (mean squared distance, 0 best) and the log-loss (cross-entropy
    against the label's distribution); None for hard labels."""
    soft = getattr(dm, "soft_targets", {}).get("val")
    if soft is None:
        return None
    probs = probabilities(best["logits"], best["calibration"]["temperature"])  # (N, C), in the validation order
    brier = float((probs - soft).square().sum(-1).mean())
    log_loss = float(-(soft * probs.clamp(min=1e-12).log()).sum(-1).mean())
    if tb is not None:
        tb.experiment.add_scalar("eval/brier_soft", brier, step)
        tb.experiment.add_scalar("eval/log_loss_soft", log_loss, step)
    return f"against the validation images' label probabilities: Brier {brier:.4f}, log-loss {log_loss:.4f}"


def unknown_line(best: dict) -> str:
    """What fit prints of the best checkpoint's rejection record (measure_after_fit)."""
    record = best["unknown"]
    shared = record.get("shared_threshold_classes") or []
    own = sum(t is not None for t in record.get("class_thresholds") or [])
    own = f"{own} class" if own == 1 else f"{own} classes"
    return (
        f"unknown: {record['score']} below its predicted class's threshold says 'unknown' (set on the validation "
        f"images to accept at least {ACCEPT:.0%} of each class's images like them; {own} with their own, "
        + (
            f"{', '.join(shared[:5])}{' ...' if len(shared) > 5 else ''} with too few images: the shared one"
            if shared
            else "none shared"
        )
        + f"); {len(record['thresholds'])} scores stored for vit-eval --ood"
    )


def test_after_fit(
    path: str, dm: ImageClassificationData, device: torch.device, tb: TensorBoardLogger | None, step: int, out
) -> str | None:
    """The chosen checkpoint on the data's test split, once: it chose nothing (not the checkpoint, the temperature
    or a threshold). Accuracy, balanced accuracy and NLL (at the fitted temperature) are printed, written to `out`
    (test_metrics.json) when given, and to TensorBoard under test/ (multi-label: mAP and F1 at the stored
    thresholds). None where the data has no test split."""
    from vit.evaluation.calibration import logits_of
    from vit.model.checkpoint import load_checkpoint, model_of

    if not getattr(dm, "has_test_split", False):
        return None
    dm.setup("test")
    model, record = model_of(load_checkpoint(path), path)
    logits, targets = logits_of(model, whole_val_batches(dm, "test"), device)
    if getattr(dm, "task", "multiclass") == "multilabel":
        from vit.evaluation.multilabel import multilabel_scores

        scores = multilabel_scores(logits.sigmoid(), targets, record.thresholds)
        metrics = {"checkpoint": str(path), "images": len(targets), **scores}
        _write_test(metrics, out, tb, step, ("mAP", "f1_macro", "f1_micro"))
        return (
            f"test split ({len(targets)} images, scored once, used to choose nothing): mAP {scores['mAP']:.4f}, "
            f"F1 macro {scores['f1_macro']:.4f}, micro {scores['f1_micro']:.4f}" + (f" -> {out}" if out else "")
        )
    temperature = record.temperature
    pred = logits.argmax(-1)
    metrics = {
        "checkpoint": str(path),
        "images": len(targets),
        "acc": float((pred == targets).double().mean()),
        "acc_balanced": balanced_accuracy(pred, targets, dm.num_classes),
        "nll": float(torch.nn.functional.cross_entropy(logits / temperature, targets)),
    }
    soft = getattr(dm, "soft_targets", {}).get("test")
    if soft is not None:  # the labels were probabilities: the served probabilities against them
        probs = probabilities(logits, temperature)
        metrics["brier_soft"] = float((probs - soft).square().sum(-1).mean())
        metrics["log_loss_soft"] = float(-(soft * probs.clamp(min=1e-12).log()).sum(-1).mean())
    _write_test(metrics, out, tb, step, ("acc", "acc_balanced", "nll", "brier_soft", "log_loss_soft"))
    return (
        f"test split ({metrics['images']} images, scored once, used to choose nothing): accuracy {metrics['acc']:.4f}, "
        f"balanced accuracy {metrics['acc_balanced']:.4f}" + (f" -> {out}" if out is not None else "")
    )


def _write_test(metrics: dict, out, tb: TensorBoardLogger | None, step: int, keys: tuple[str, ...]) -> None:
    """test_metrics.json (when `out` is given) and the scalars under test/ in TensorBoard."""
    import json

    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(metrics, indent=1) + "\n")
    if tb is not None:
        for key in keys:
            if key in metrics:
                tb.experiment.add_scalar(f"test/{key}", metrics[key], step)
        tb.experiment.flush()


def multilabel_after_fit(
    paths: list[str], dm: ImageClassificationData, device: torch.device, tb: TensorBoardLogger | None, step: int
) -> str:
    """A multi-label model's per-label thresholds, chosen on the validation set (the best F1 of each label) and stored
    in each checkpoint under "multilabel" (rewritten atomically); the line fit prints of the best one, beside the
    per-label majority baseline. No temperature and no rejection record: both read a softmax over the classes."""
    from vit.evaluation.calibration import logits_of
    from vit.evaluation.multilabel import label_thresholds, majority_baseline, multilabel_scores
    from vit.model.checkpoint import load_checkpoint, model_of
    from vit.training.checkpoint_io import AtomicCheckpointIO

    lines = {}
    for path in dict.fromkeys(paths):
        ckpt = load_checkpoint(path)
        model, _ = model_of(ckpt, path)
        logits, targets = logits_of(model, whole_val_batches(dm), device)
        probs = logits.sigmoid()
        thresholds = label_thresholds(probs, targets)
        scores = multilabel_scores(probs, targets, thresholds)
        ckpt["multilabel"] = {"thresholds": thresholds, "val": {k: scores[k] for k in ("mAP", "f1_macro", "f1_micro")}}
        AtomicCheckpointIO().save_checkpoint(ckpt, path)
        lines[path] = scores
    best = lines[paths[0]]
    counts = torch.tensor(dm.class_counts() or [0] * dm.num_classes, dtype=torch.float64)
    train_n = len(dm.samples["train"]) if getattr(dm, "samples", None) else max(1, int(counts.max()))
    base = majority_baseline(counts / max(1, train_n), targets)
    if tb is not None:
        for key in ("mAP", "f1_macro", "f1_micro"):
            tb.experiment.add_scalar(f"eval/{key}", best[key], step)
        tb.experiment.flush()
    return (
        f"multi-label: a threshold per label chosen on the validation set (its best F1), kept for vit-predict; there: "
        f"mAP {best['mAP']:.4f}, F1 macro {best['f1_macro']:.4f}, micro {best['f1_micro']:.4f} (per-label majority: "
        f"mAP {base['mAP']:.4f}, F1 macro {base['f1_macro']:.4f}, micro {base['f1_micro']:.4f})"
    )


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _unknown_record(model, train, dm: ImageClassificationData, device: torch.device, val: tuple) -> dict:
    """One model's rejection record (vit.evaluation.unknown.rejection_record) from its outputs on the training images
    (no augmentation; none for a stream) and on the validation images `val` (features_of's four)."""
    outputs = features_of(model, train, device) if train is not None else None
    record = rejection_record(outputs, val, list(dm.class_names))
    # written only as every reader checks it (vit/model/record.py unknown_of): a wrong shape fails here, at fit
    unknown_of({"unknown": record}, "the rejection record made after fit", model.cfg)
    return record
