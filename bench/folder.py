"""A folder of real images through `train.py fit --config configs/folder.yaml` against a bare PyTorch loop over the same
images already in memory: same model, same fused AdamW, same batch size; interleaved step by step, several rounds.

    python bench/data/to_folder.py ../shared/data/mnist10k.npz /tmp/mnist_png --val 2000
    python bench/folder.py /tmp/mnist_png --rounds 3

Each round is one epoch of the real command. After each of its training steps a callback runs one step of the bare
loop (index a uint8 tensor, normalise, forward, loss, backward, AdamW: no augmentation, no Lightning) and times it
apart, so both run under the same machine load: on this shared 2-core machine whole epochs timed one after the other
varied by up to 40% (0.72-1.13 for the same code). Ours is the time between the ends of consecutive training steps
minus the bare steps: Lightning's loop, the in-memory path's batched augmentation, the model, the optimizer. The
whole epoch (with validation on the held-out images, checkpoints and attention maps, which the bare loop does not do)
and setup (listing and decoding every file once) are reported apart.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import train  # noqa: E402
from vit.data.folder import ImageFolderDataModule
from vit.model.vision_transformer import VisionTransformer

MODEL = dict(embed_dim=128, depth=4, num_heads=4, patch_size=4)  # a small model at the images' own 28 px


class BareLoop:
    """The 40-line loop, one step at a time, over uint8 images in memory."""

    def __init__(self, images: torch.Tensor, targets: torch.Tensor, mean, std, batch_size: int):
        self.images, self.targets, self.batch_size = images, targets, batch_size
        self.mean = torch.tensor(mean)[:, None, None] * 255
        self.std = torch.tensor(std)[:, None, None] * 255
        num_classes, in_chans = int(targets.max()) + 1, images.shape[1]  # a grey folder trains on 1 channel
        self.model = VisionTransformer(img_size=images.shape[-1], num_classes=num_classes, in_chans=in_chans, **MODEL)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, weight_decay=0.05, fused=True)
        self.order, self.i = torch.randperm(len(images)), 0

    def step(self) -> float:
        """One training step; returns its seconds."""
        t = time.perf_counter()
        if self.i + self.batch_size > len(self.images):
            self.order, self.i = torch.randperm(len(self.images)), 0
        idx = self.order[self.i : self.i + self.batch_size]
        self.i += self.batch_size
        x = (self.images[idx].float() - self.mean) / self.std
        loss = F.cross_entropy(self.model(x), self.targets[idx])
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return time.perf_counter() - t


class Interleaved(L.Callback):
    """After each of our training steps, one bare step, timed apart from ours."""

    bare: BareLoop | None = None
    rounds: list[dict] = []

    def on_train_epoch_start(self, trainer, pl_module):
        self.ours, self.theirs, self.steps = 0.0, 0.0, 0
        self._epoch_start = self._mark = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.ours += time.perf_counter() - self._mark
        self.theirs += Interleaved.bare.step()
        self.steps += 1
        self._mark = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module):  # Lightning validates before this hook
        whole = time.perf_counter() - self._epoch_start - self.theirs
        Interleaved.rounds.append({"ours_s": self.ours, "bare_s": self.theirs, "steps": self.steps, "epoch_s": whole})


def ours(root: str, batch_size: int, workdir: Path) -> dict:
    """One epoch of the real command with a bare step after each of its steps."""
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
        "--trainer.callbacks+=bench.folder.Interleaved",
        *(f"--model.arch.{k}={v}" for k, v in MODEL.items()),
    ]
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        train.main(args)
    finally:
        os.chdir(cwd)
    import bench.folder  # the CLI instantiated the callback from this module, not from __main__

    return bench.folder.Interleaved.rounds[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", help="a folder of class subfolders (e.g. written by shared/data/to_folder.py)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--out", default=str(Path(__file__).parent / "folder.json"))
    args = ap.parse_args()
    import tempfile

    import bench.folder

    t = time.perf_counter()
    dm = ImageFolderDataModule(args.root, img_size=28, num_workers=0)
    setup_s = time.perf_counter() - t
    images, targets = dm.memory["train"]
    print(f"setup: {len(images) + len(dm.memory['val'][0])} files decoded in {setup_s:.1f} s ({dm.in_memory=})")
    bench.folder.Interleaved.bare = BareLoop(images, targets, dm.mean, dm.std, args.batch_size)
    bench.folder.Interleaved.bare.step()  # warm-up
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for r in range(args.rounds):
            got = ours(args.root, args.batch_size, Path(work))
            n = got["steps"] * args.batch_size
            rows.append(
                {
                    "ours_img_s": n / got["ours_s"],
                    "bare_img_s": n / got["bare_s"],
                    "ratio": got["bare_s"] / got["ours_s"],
                    "epoch_with_validation_s": got["epoch_s"],
                }
            )
            print(
                f"round {r}: ours {rows[-1]['ours_img_s']:.0f} img/s, bare {rows[-1]['bare_img_s']:.0f} img/s, "
                f"ratio {rows[-1]['ratio']:.3f}; whole epoch with validation {got['epoch_s']:.1f} s",
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
