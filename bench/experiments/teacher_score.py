"""A teacher file that `vit-train --model.teacher NAME` wrote (teacher.safetensors), scored alone on a held-out folder
of class folders: accuracy and balanced accuracy, the images resized to SIZE and normalised the teacher's way.

    python bench/experiments/teacher_score.py RUN/teacher.safetensors cells_cv/test0 --size 64
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.experiments.resnet_loop import load  # noqa: E402
from vit.training.teacher import load_teacher  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("teacher")
    ap.add_argument("test")
    ap.add_argument("--size", type=int, default=64)
    a = ap.parse_args()
    x, y, classes = load(a.test, None, a.size)
    teacher, record = load_teacher(a.teacher, num_classes=len(classes), in_chans=x.shape[1])
    teacher.eval()
    with torch.no_grad():
        pred = torch.cat([teacher((b.float() / 255 - teacher.mean) / teacher.std).argmax(-1) for b in x.split(256)])
    recall = [float((pred[y == c] == c).float().mean()) for c in range(len(classes))]
    row = {"teacher": a.teacher, "test": a.test, "epochs": record.get("epochs"), "val_acc": record.get("val_acc"),
           "acc": round(float((pred == y).float().mean()), 4), "acc_balanced": round(sum(recall) / len(recall), 4)}  # fmt: skip
    print(json.dumps(row))


if __name__ == "__main__":
    main()
