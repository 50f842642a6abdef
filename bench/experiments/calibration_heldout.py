"""Calibration on images not used to fit the temperature: the validation set split in two seeded halves, T fitted on
one, ECE and NLL measured on the other, both ways. For the digits checkpoints of `make train` (any seeds):

    python train.py --config configs/digits.yaml --seed_everything S     # S = 0, 1, 2
    python bench/experiments/calibration_heldout.py checkpoints/digits/version_*/last.ckpt
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vit.data.device import DeviceBatches  # noqa: E402
from vit.data.digits import DigitsDataModule
from vit.evaluation.calibration import calibration_report, fit_temperature, logits_of  # noqa: E402
from vit.model.checkpoint import load_model  # noqa: E402


def main(paths: list[str]) -> None:
    dm = DigitsDataModule()
    x, y = dm.memory["val"]
    for path in paths:
        model, _ = load_model(path)
        logits, targets = logits_of(
            model, DeviceBatches(x, y, len(y), dm.mean, dm.std, train=False), torch.device("cpu")
        )
        perm = torch.randperm(len(targets), generator=torch.Generator().manual_seed(0))
        halves = perm[: len(perm) // 2], perm[len(perm) // 2 :]
        for fit, held, name in ((*halves, "A->B"), (*reversed(halves), "B->A")):
            t = fit_temperature(logits[fit], targets[fit])
            r = calibration_report(logits[held], targets[held], t)
            print(
                f"{path} {name}: T {t:.3f}, ECE {r['ece_uncalibrated']:.4f} -> {r['ece']:.4f}, "
                f"NLL {r['nll_uncalibrated']:.4f} -> {r['nll']:.4f}"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
