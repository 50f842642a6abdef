"""What the post-hoc logit adjustment did on held-out images: each run's chosen checkpoint scored on its test folder
with the tau that fit folded into the head's bias, and with that bias unfolded (tau = 0: raw = adjusted + tau * log
prior, the prior and tau read from the checkpoint's `logit_adjustment` record).

    python bench/experiments/tau_heldout.py RUN/log.txt:cells_cv/test0 RUN2/log.txt:cells_cv/test1 ...

RUN/log.txt is the log budget_runs.py keeps (its last `checkpoint:` line names the chosen checkpoint). Prints one
JSON row a run: {"log", "tau", "adjusted": [acc, balanced], "tau0": [acc, balanced]} in percent. Images are decoded
and normalised as vit-predict reads them.
"""

import argparse
import json
import re
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from vit.deployment.predict import ImageFiles, channel_stats, collate, normalize
from vit.evaluation.scores import balanced_accuracy
from vit.model.checkpoint import load_checkpoint, load_model


def labelled_files(folder: str) -> tuple[list[str], torch.Tensor]:
    """folder/<class>/<image>: the files and their class indices (classes sorted by name, as training sorts them)."""
    classes = sorted(p for p in Path(folder).iterdir() if p.is_dir())
    pairs = [(str(f), k) for k, c in enumerate(classes) for f in sorted(c.iterdir())]
    return [f for f, _ in pairs], torch.tensor([k for _, k in pairs])


@torch.no_grad()
def logits_of(ckpt_path: str, files: list[str]) -> torch.Tensor:
    model, hp = load_model(ckpt_path)
    model.eval()
    loader = DataLoader(ImageFiles(files, hp.img_size, hp.in_chans), batch_size=256, collate_fn=collate)
    mean, std = channel_stats(hp, torch.device("cpu"))
    return torch.cat([model(normalize(x, mean, std)) for x, _, _ in loader])  # (N, C)


def percent_right(logits: torch.Tensor, y: torch.Tensor) -> list[float]:
    """[accuracy, balanced accuracy] in percent, one decimal, of logits (N, C) against labels (N,)."""
    pred = logits.argmax(-1)
    acc, bal = (pred == y).float().mean(), balanced_accuracy(pred, y, logits.shape[-1])
    return [round(100 * float(acc), 1), round(100 * float(bal), 1)]


def runs(description: str) -> list[tuple[str, str, str]]:
    """The command line's LOG:TEST pairs as (log, held-out folder, the run's chosen checkpoint: the log's last
    `checkpoint:` line)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("runs", nargs="+", help="LOG:TEST, a budget_runs.py log and the run's held-out folder")
    pairs = [pair.rsplit(":", 1) for pair in ap.parse_args().runs]
    return [(log, test, re.findall(r"checkpoint: (\S+)", Path(log).read_text())[-1]) for log, test in pairs]


def main() -> None:
    for log, test, ckpt in runs(__doc__.split("\n\n")[0]):
        record = load_checkpoint(ckpt).get("logit_adjustment") or {"tau": 0.0}
        files, y = labelled_files(test)
        adjusted = logits_of(ckpt, files)
        log_prior = torch.tensor(record["prior"]).log() if record["tau"] else torch.zeros(adjusted.shape[-1])
        row = {"log": log, "tau": record["tau"]}
        for name, logits in (("adjusted", adjusted), ("tau0", adjusted + record["tau"] * log_prior)):
            row[name] = percent_right(logits, y)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
