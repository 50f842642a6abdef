"""A distilled run's two heads on held-out images: the checkpoint that `--model.arch.dist_token true --model.teacher
NAME` chose, scored on its test folder by the mean of the two heads (what it serves, DeiT's answer), by the class
head alone and by the distillation token's head alone (each with the post-hoc tau the file holds, folded into both).

    python bench/experiments/dist_heads.py RUN/log.txt:cells_cv/test0 RUN2/log.txt:cells_cv/test1 ...

RUN/log.txt is the log budget_runs.py keeps. Prints one JSON row a run: {"log", "served", "class_head",
"dist_head"}, each [acc, balanced] in percent. Images are decoded and normalised as vit-predict reads them.
"""

import json

import torch
from tau_heldout import labelled_files, percent_right, runs  # same folder: run as a script
from torch.utils.data import DataLoader

from vit.deployment.predict import ImageFiles, channel_stats, collate, normalize
from vit.model.checkpoint import load_model


@torch.no_grad()
def heads_of(ckpt_path: str, files: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The class head's and the distillation head's logits, (N, C) each."""
    model, hp = load_model(ckpt_path)
    model.eval()
    loader = DataLoader(ImageFiles(files, hp.img_size, hp.in_chans), batch_size=256, collate_fn=collate)
    mean, std = channel_stats(hp, torch.device("cpu"))
    pairs = [model.forward_heads(model.forward_features(normalize(x, mean, std))) for x, _, _ in loader]
    return torch.cat([c for c, _ in pairs]), torch.cat([d for _, d in pairs])


def main() -> None:
    for log, test, ckpt in runs(__doc__.split("\n\n")[0]):
        files, y = labelled_files(test)
        cls, dist = heads_of(ckpt, files)
        row = {"log": log}
        for name, logits in (("served", (cls + dist) / 2), ("class_head", cls), ("dist_head", dist)):
            row[name] = percent_right(logits, y)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
