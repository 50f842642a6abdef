"""The plan's ViT and a CNN teacher averaged, on held-out images: a run's chosen checkpoint (its post-hoc tau unfolded,
as the gated rule serves it when it keeps tau 0) and a teacher file (`--model.teacher` wrote it) scored on the same
test folder alone and as the mean of their softmax probabilities.

    python bench/experiments/ensemble_heldout.py RUN/log.txt:cells_cv/test0:TEACHER.safetensors ...

Prints one JSON row a run: {"log", "vit", "teacher", "mean"}, each [acc, balanced] in percent. Images are decoded and
normalised as vit-predict reads them; the teacher sees them in its own normalisation.
"""

import argparse
import json
import re
from pathlib import Path

import torch
from tau_heldout import labelled_files, percent_right  # same folder: run as a script
from torch.utils.data import DataLoader

from vit.deployment.predict import ImageFiles, channel_stats, collate, normalize
from vit.model.checkpoint import load_checkpoint, load_model
from vit.training.teacher import load_teacher


@torch.no_grad()
def both_logits(ckpt: str, teacher_file: str, files: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The ViT's logits with its folded tau taken out again, and the teacher's, (N, C) each."""
    model, hp = load_model(ckpt)
    record = load_checkpoint(ckpt).get("logit_adjustment") or {"tau": 0.0}
    teacher, _ = load_teacher(teacher_file, model.num_classes, hp.in_chans)
    model.eval(), teacher.eval()
    mean, std = channel_stats(hp, torch.device("cpu"))
    loader = DataLoader(ImageFiles(files, hp.img_size, hp.in_chans), batch_size=256, collate_fn=collate)
    vit, cnn = [], []
    for x, _, _ in loader:
        x = normalize(x, mean, std)
        vit.append(model(x))
        cnn.append(teacher(teacher.renormalise(x, mean.view(1, -1, 1, 1), std.view(1, -1, 1, 1))))
    vit = torch.cat(vit)
    if record["tau"]:
        vit = vit + record["tau"] * torch.tensor(record["prior"]).log()
    return vit, torch.cat(cnn)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="LOG:TEST:TEACHER")
    for spec in ap.parse_args().runs:
        log, test, teacher_file = spec.split(":")
        ckpt = re.findall(r"checkpoint: (\S+)", Path(log).read_text())[-1]
        files, y = labelled_files(test)
        vit, cnn = both_logits(ckpt, teacher_file, files)
        mean = (vit.softmax(-1) + cnn.softmax(-1)) / 2
        row = {
            "log": log,
            "vit": percent_right(vit, y),
            "teacher": percent_right(cnn, y),
            "mean": percent_right(mean, y),
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
