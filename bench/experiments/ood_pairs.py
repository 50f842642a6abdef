"""Unknown-image scores on development pairs: a checkpoint, its own validation split, and folders of other images.

    python bench/experiments/ood_pairs.py OUT.jsonl --ckpt CKPT --ood far:DIR near:DIR ...

For a checkpoint trained before rejection existed, the statistics are made first, as `vit-train fit` makes them at
its end (vit/evaluation/after_fit.py's measure_after_fit on the training data its record names, on a copy of the
file); then `vit-eval --split val --ood DIR` scores every candidate against each folder. One row per folder:
AUROC and FPR at 95% TPR of each score, the share of the validation split the default rejects, and the accuracy on
what it accepts. docs/evaluation.md, "Unknown images", has the table.
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from vit.commands.eval import main as eval_main
from vit.data.folder import ImageFolderDataModule
from vit.deployment.labelled import training_data
from vit.evaluation.after_fit import measure_after_fit, unknown_line
from vit.model.checkpoint import load_checkpoint, model_of


def with_statistics(ckpt: Path, folder: Path, score: str | None = None) -> Path:
    """A copy of `ckpt` holding the rejection record (made from its own training and validation data); `score`: the
    one the record applies (default: DEFAULT_SCORE, as fit chooses), with its stored threshold."""
    copy = folder / ckpt.name
    shutil.copy(ckpt, copy)
    raw = load_checkpoint(copy)
    _, record = model_of(raw, copy)
    if record.data["class_path"].endswith("ImageFolderDataModule"):  # decoded into memory: the training features
        args = {**record.data["init_args"], "in_memory": True, "mean": list(record.mean), "std": list(record.std)}
        dm = ImageFolderDataModule(**args)
    else:
        dm = training_data(str(copy), record)
    dm.setup("fit")
    print(unknown_line(measure_after_fit([str(copy)], dm, torch.device("cpu"))[str(copy)]), file=sys.stderr)
    if score is not None:
        raw = torch.load(copy, map_location="cpu", weights_only=True)
        raw["unknown"] |= {"score": score, "threshold": raw["unknown"]["thresholds"][score]}
        torch.save(raw, copy)
    return copy


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--ckpt", required=True)
    p.add_argument("--ood", nargs="+", required=True, help="KIND:DIR, e.g. far:mnist_val near:other_classes")
    p.add_argument("--score", help="the score the record applies (rejection shares); default: DEFAULT_SCORE")
    p.add_argument("--heldout", help="a labelled <class>/<image> folder no part of the run saw: the share rejected")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = with_statistics(Path(a.ckpt), Path(tmp), a.score)
        if a.heldout:
            out = Path(tmp, "heldout")
            assert eval_main(["--ckpt", str(ckpt), a.heldout, "--out", str(out)]) in (0, 1)
            metrics = json.loads((out / "metrics.json").read_text())
            with open(a.out, "a") as f:
                f.write(json.dumps({"ckpt": a.ckpt, "kind": "heldout", "top1": metrics["top1"],
                                    "unknown": metrics["unknown"]}) + "\n")  # fmt: skip
        for spec in a.ood:
            kind, _, folder = spec.partition(":")
            out = Path(tmp, "eval")
            assert eval_main(["--ckpt", str(ckpt), "--split", "val", "--ood", folder, "--out", str(out)]) == 0
            metrics = json.loads((out / "metrics.json").read_text())
            row = {"ckpt": a.ckpt, "kind": kind, "ood": folder, "top1": metrics["top1"], "unknown": metrics.get("unknown"),
                   "ood_scores": metrics["ood"]}  # fmt: skip
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
