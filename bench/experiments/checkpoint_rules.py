"""Which checkpoint, and how far to shift its logits: the long-tail rule's two choices, scored on held-out images.

For a run saved with `--checkpoint.save_top_k -1` (every epoch's best-epochNNN.ckpt), each rule picks an epoch from
the validation scores the run logged to TensorBoard: the best val/acc, the best val/acc_balanced, the lowest val/loss,
the last. Each picked checkpoint is scored on a held-out folder (<class>/<image>, read as vit-predict reads it) with
its logits as trained and shifted by `-tau * log(prior)` (the training split's class shares, as the post-hoc logit
adjustment shifts them) for each tau given. A checkpoint the run's own post-hoc adjustment rewrote is scored with its
shift taken back out first, so every row starts from the logits as trained.

    python bench/experiments/checkpoint_rules.py RUN_DIR cells4_cv/test3 --taus 0 0.5 1 2 --out rules.json
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vit.deployment.labelled import FileBatches, labelled_folder  # noqa: E402
from vit.evaluation.calibration import logits_of  # noqa: E402
from vit.evaluation.logit_adjustment import log_prior  # noqa: E402
from vit.evaluation.scores import balanced_accuracy  # noqa: E402
from vit.model.checkpoint import load_model  # noqa: E402

RULES = {"best val/acc": ("val/acc", max), "best val/acc_balanced": ("val/acc_balanced", max)}
RULES["lowest val/loss"] = ("val/loss", min)


def logged(run_dir: Path) -> dict[str, list[float]]:
    """Each validation scalar the run logged, one value an epoch, in order (the sanity check logs none)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = sorted(run_dir.glob("logs/*/version_*/events.out.tfevents.*"))
    if not events:
        raise SystemExit(f"{run_dir}: no TensorBoard events under logs/*/version_*/")
    acc = EventAccumulator(str(events[-1].parent), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"] if tag.startswith("val/")}


def picks(scores: dict[str, list[float]], epochs: int) -> dict[str, int]:
    """The epoch each rule keeps (0-based)."""
    out = {}
    for name, (tag, better) in RULES.items():
        values = scores[tag][:epochs]
        out[name] = values.index(better(values))
    out["last"] = epochs - 1
    return out


def class_counts(ckpt: Path, class_names: list[str]) -> list[int]:
    """Training images per class of the run (its split.csv beside the logs; RUN/checkpoints/NAME/version_N/CKPT)."""
    import csv

    split = sorted(ckpt.parents[3].glob("logs/*/version_*/split.csv"))[-1]
    with split.open() as f:
        labels = [row["label"] for row in csv.DictReader(f) if row["split"] == "train"]
    return [labels.count(c) for c in class_names]


def held_out(ckpt: Path, test: Path, taus: list[float]) -> dict[str, list[float]]:
    """{tau: [accuracy, balanced accuracy]} of the checkpoint's logits on the held-out folder, shifted by each tau."""
    model, record = load_model(ckpt)
    files, targets = labelled_folder(test, list(record.class_names))
    batches = FileBatches(files, targets, record, 64, None, torch.device("cpu"))
    logits, y = logits_of(model, batches, torch.device("cpu"))
    done = record.logit_adjustment or {}
    if done.get("tau"):  # the run folded -tau * log(prior) into the head: take it back out
        logits = logits + done["tau"] * torch.tensor(done["prior"]).log()
    prior = log_prior(class_counts(ckpt, record.class_names))
    out = {}
    for tau in taus:
        pred = (logits - tau * prior).argmax(-1)
        out[f"{tau:g}"] = [float((pred == y).float().mean()), float(balanced_accuracy(pred, y, logits.shape[1]))]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("test", type=Path, help="held-out images, <class>/<image>")
    p.add_argument("--taus", type=float, nargs="+", default=[0.0, 0.5, 1.0, 1.5, 2.0])
    p.add_argument("--out", type=Path, help="append the rows here as one JSON line")
    a = p.parse_args()
    ckpts = sorted(a.run_dir.glob("checkpoints/*/version_*/best-epoch*.ckpt"))
    chosen = {int(c.stem.removeprefix("best-epoch")): c for c in ckpts}
    scores = logged(a.run_dir)
    epochs = len(scores["val/acc"])
    row = {"run": str(a.run_dir), "epochs": epochs, "rules": {}}
    for rule, epoch in picks(scores, epochs).items():
        if epoch not in chosen:
            raise SystemExit(f"{a.run_dir}: no checkpoint of epoch {epoch} (run with --checkpoint.save_top_k -1)")
        row["rules"][rule] = {"epoch": epoch, "held_out": held_out(chosen[epoch], a.test, a.taus)}
        print(rule, json.dumps(row["rules"][rule]), flush=True)
    if a.out:
        with a.out.open("a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
