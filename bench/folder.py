"""A folder of real images through `train.py fit --config configs/folder.yaml` against a bare PyTorch loop over the same
images already in memory: same model, same fused AdamW, same batch size; interleaved rounds, median.

    python ../shared/data/to_folder.py ../shared/data/mnist10k.npz /tmp/mnist_png --val 2000
    python bench/folder.py /tmp/mnist_png --rounds 3

Ours is one training epoch of the real command (timed from the epoch's first batch to its end: Lightning's loop, the
in-memory path's batched augmentation, the model); setup (listing and decoding every file once) is reported apart. The
bare loop indexes a uint8 tensor, normalises, and steps: no augmentation, no Lightning.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import train  # noqa: E402
from vit.data import ImageFolderDataModule  # noqa: E402
from vit.model import VisionTransformer  # noqa: E402

MODEL = dict(embed_dim=128, depth=4, num_heads=4, patch_size=4)  # the issue's small model at the images' own 28 px


class EpochTimer(L.Callback):
    """Seconds of each training epoch, first batch to last."""

    times: list[float] = []

    def on_train_epoch_start(self, trainer, pl_module):
        self._t = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module):
        EpochTimer.times.append(time.perf_counter() - self._t)


def ours(root: str, batch_size: int, workdir: Path) -> tuple[float, int]:
    """One epoch of the real command; returns (seconds, training images)."""
    flags = [f"--model.arch.{k}={v}" for k, v in MODEL.items()]
    args = [
        "fit",
        "--config",
        "configs/folder.yaml",
        f"--data.root={root}",
        "--plan=false",  # the data path, not the recipe: the same fields every round, no calibration
        "--data.init_args.img_size=28",
        f"--data.init_args.batch_size={batch_size}",
        "--trainer.max_epochs=1",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.callbacks+=bench.folder.EpochTimer",
        *flags,
    ]
    import os

    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        cli = train.main(args)
    finally:
        os.chdir(cwd)
    import bench.folder  # the CLI instantiated the callback from this module, not from __main__

    return bench.folder.EpochTimer.times[-1], len(cli.datamodule.memory["train"][0])


def bare(images: torch.Tensor, targets: torch.Tensor, mean, std, batch_size: int) -> float:
    """One epoch of a plain loop over the same uint8 images: seconds."""
    model = VisionTransformer(img_size=28, num_classes=10, **MODEL)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05, fused=True)
    mean = torch.tensor(mean)[:, None, None] * 255
    std = torch.tensor(std)[:, None, None] * 255
    t = time.perf_counter()
    order = torch.randperm(len(images))
    for i in range(0, len(images) - batch_size + 1, batch_size):
        idx = order[i : i + batch_size]
        x = (images[idx].float() - mean) / std
        loss = F.cross_entropy(model(x), targets[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", help="a folder of class subfolders (e.g. written by shared/data/to_folder.py)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--out", default=str(Path(__file__).parent / "folder.json"))
    args = ap.parse_args()
    import tempfile

    t = time.perf_counter()
    dm = ImageFolderDataModule(args.root, img_size=28, num_workers=0)
    setup_s = time.perf_counter() - t
    images, targets = dm.memory["train"]
    print(f"setup: {len(images) + len(dm.memory['val'][0])} files decoded in {setup_s:.1f} s ({dm.in_memory=})")
    bare(images[:256], targets[:256], dm.mean, dm.std, args.batch_size)  # warm-up
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for r in range(args.rounds):
            t_ours, n = ours(args.root, args.batch_size, Path(work))
            t_bare = bare(images, targets, dm.mean, dm.std, args.batch_size)
            n_steps = (n // args.batch_size) * args.batch_size
            rows.append({"ours_img_s": n_steps / t_ours, "bare_img_s": n_steps / t_bare, "ratio": t_bare / t_ours})
            print(
                f"round {r}: ours {rows[-1]['ours_img_s']:.0f} img/s, bare {rows[-1]['bare_img_s']:.0f} img/s, "
                f"ratio {rows[-1]['ratio']:.3f}",
                flush=True,
            )
    result = {
        "setup_s": setup_s,
        "files": len(images) + len(dm.memory["val"][0]),
        "rounds": rows,
        "median_ratio": statistics.median(r["ratio"] for r in rows),
        "goal": ">= 0.95",
    }
    print(f"median ratio ours/bare images/s: {result['median_ratio']:.3f} (goal >= 0.95); setup {setup_s:.1f} s")
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
