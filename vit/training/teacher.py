"""A convolutional teacher inside the run's budget: DeiT's hard distillation (Touvron et al. 2021).

`--model.teacher regnetx_002` names a small timm CNN. When fit starts, `TeacherFit` trains it from scratch on the run's
own training batches (the same augmentation, on the same device) for `teacher_share` of the time left before the
budget's deadline (without a budget: that share of max_epochs, at least one epoch; an epoch and the validation pass as
`limit_train_batches` and `limit_val_batches` count them), scores it on the validation images, freezes it and hands
it to the module. The ViT's training loss then is

    (1 - w) * CE(logits, labels) + w * CE(logits, the teacher's predicted class on the same augmented batch)

with w = `distill_weight` (DeiT: 0.5). The teacher is saved beside the checkpoints as `teacher.safetensors` (weights
and plain metadata, no pickle) and `--model.teacher PATH.safetensors` reuses it without training. The ViT alone is
checkpointed, exported and served: nothing downstream changes. A resumed run (`--ckpt_path`) reloads the teacher file
it wrote instead of training another. Under DDP each rank trains its own teacher on its shard of the batches.

Why a small CNN: on a 2-core CPU at 64 px and batch 64, a training step of timm's ResNet-18 costs ~10x the planned
96 x 4 ViT's (1.2-1.9 s against 0.11-0.2 s, one thread) and its forward alone ~2.5x, so distilling from it would make
every student epoch ~3x slower; RegNetX-200MF trains at ~2x and infers at ~0.4x the ViT's step (docs/recipes.md).
"""

from __future__ import annotations

import itertools
import json
import math
import time
from pathlib import Path

import lightning as L
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from vit.model.cnn_weights import CnnWeights, build_cnn, looks_pretrained, read_cnn_weights
from vit.model.weight_names import TENSOR_SUFFIXES, names_a_file
from vit.training.metrics import ConfusionCounts, TopKAccuracy

TEACHER_FILE = "teacher.safetensors"


class Teacher(torch.nn.Module):
    """A frozen timm CNN that answers in the student's normalisation: images (B, C, H, W) normalised with the
    student's mean/std -> logits (B, num_classes). `mean`, `std` are the ones the CNN was trained with (ImageNet
    weights: theirs); `img_size` its own resolution (None: the student's), to which `renormalise` resizes the view."""

    def __init__(
        self,
        name: str,
        num_classes: int,
        in_chans: int,
        mean: list[float],
        std: list[float],
        img_size: int | None = None,
        weights: CnnWeights | None = None,
    ):
        super().__init__()
        self.name, self.num_classes, self.in_chans, self.img_size = name, num_classes, in_chans, img_size
        if weights is not None:  # ImageNet features, a new head, the first convolution adapted to the channels
            self.net = build_cnn(weights, num_classes, in_chans)
        else:
            self.net = timm.create_model(name, num_classes=num_classes, in_chans=in_chans)
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1), persistent=False)

    def renormalise(self, x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """From the student's view (mean, std: (1, C, 1, 1)) to the teacher's normalisation and side; the identity
        when they match."""
        x = (x * std + mean - self.mean) / self.std
        if self.img_size and x.shape[-1] != self.img_size:
            x = F.interpolate(x, size=(self.img_size, self.img_size), mode="bilinear", antialias=True)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def with_features(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits (B, num_classes) and the feature map of each stage after the stem, (B, C_s, H_s, W_s) from the
        finest to the coarsest (timm's forward_intermediates)."""
        final, maps = self.net.forward_intermediates(x)
        return self.net.forward_head(final), maps[1:]

    def save(self, path: Path, **record) -> None:
        # the record's `name` is what the run was given (a weights file, say): `source`; `name` is the architecture
        meta = {
            **record,
            "source": record.get("name", self.name),
            "name": self.name,
            "num_classes": self.num_classes,
            "in_chans": self.in_chans,
            "mean": self.mean.flatten().tolist(),
            "std": self.std.flatten().tolist(),
            "img_size": self.img_size,
        }
        save_file(self.net.state_dict(), str(path), metadata={"teacher": json.dumps(meta)})


def pretrained_teacher(source: str, num_classes: int, in_chans: int, img_size: int | None) -> Teacher:
    """A teacher from ImageNet weights (vit/model/cnn_weights.py): their architecture, their normalisation (one
    value a channel, cycled over grey or multi-band inputs) and `img_size` (None: the student's side)."""
    weights = read_cnn_weights(source)
    mean = [weights.mean[i % len(weights.mean)] for i in range(in_chans)]
    std = [weights.std[i % len(weights.std)] for i in range(in_chans)]
    return Teacher(weights.arch, num_classes, in_chans, mean, std, img_size, weights=weights)


def hard_distillation(loss: torch.Tensor, distill: tuple | None, weight: float) -> torch.Tensor:
    """DeiT's hard distillation: `(1 - weight) * loss + weight * CE(student, the teacher's class)`, `distill` being
    (student logits, teacher logits), both (B, C) on the same batch (the module's `forward_train`); the loss alone
    without a teacher (None: no teacher, or a multi-label task, refused when the module is built)."""
    if distill is None:
        return loss
    student, teacher_logits = distill
    return (1 - weight) * loss + weight * F.cross_entropy(student, teacher_logits.argmax(-1))


def teacher_channels(name: str, in_chans: int) -> list[int]:
    """The channels of a teacher's stages after the stem (what `Teacher.with_features` returns), from a timm name or a
    teacher file's record, without its weights."""
    if looks_pretrained(name):
        name = read_cnn_weights(name).arch
    elif name.endswith(".safetensors"):
        name = teacher_record(name)["name"]
    return [info["num_chs"] for info in timm.create_model(name, in_chans=in_chans).feature_info][1:]


class LocalityGuidance(torch.nn.Module):
    """Locality guidance (Li et al., ECCV 2022: a ViT trained from scratch on little data imitates a CNN's features):
    each block's output tokens, through a linear map to the teacher stage's channels, regress that stage's feature
    map resized to the token grid and normalised per position (the teacher's scale is its own). Early blocks read
    early (local) stages: with L blocks and S stages, block i reads stage floor(i * S / L). The loss is the mean
    squared error over the blocks, weighted by `--model.guidance_weight`. The maps live in the Lightning module
    beside the ViT (`guidance.*` in the state dict), never in the exported or served model.

    Args:
        dim: the ViT's width D.
        channels: the teacher's stages' channels (`teacher_channels`).
        depth: the ViT's blocks L.
    """

    def __init__(self, dim: int, channels: list[int], depth: int):
        super().__init__()
        self.stage_of = [i * len(channels) // depth for i in range(depth)]
        self.proj = torch.nn.ModuleList(torch.nn.Linear(dim, channels[s]) for s in self.stage_of)

    @classmethod
    def of(cls, teacher: str, arch) -> LocalityGuidance:
        """For a ViTConfig `arch` and a teacher's timm name or file."""
        return cls(arch.embed_dim, teacher_channels(teacher, arch.in_chans), arch.depth)

    def forward(self, taps: list[torch.Tensor], maps: list[torch.Tensor], grid: tuple[int, int]) -> torch.Tensor:
        """taps: each block's patch tokens (B, N, D), N = gh * gw row by row; maps: the teacher's (B, C_s, H_s, W_s)."""
        losses = []
        for tokens, proj, s in zip(taps, self.proj, self.stage_of, strict=True):
            target = F.interpolate(maps[s], size=grid, mode="bilinear", antialias=True, align_corners=False)
            target = target.flatten(2).transpose(1, 2)  # (B, N, C_s)
            target = F.layer_norm(target, target.shape[-1:])
            losses.append(F.mse_loss(proj(tokens), target))
        return torch.stack(losses).mean()


def teacher_record(path: str | Path) -> dict:
    """The metadata `Teacher.save` wrote (safetensors: data, never code); a one-line error for any other file."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return json.loads((f.metadata() or {})["teacher"])
    except (OSError, KeyError, ValueError) as e:
        raise ValueError(f"{path}: not a teacher file written by vit-train ({type(e).__name__}: {e})") from None


def load_teacher(path: str | Path, num_classes: int, in_chans: int) -> tuple[Teacher, dict]:
    """A teacher saved by `Teacher.save` and its record; one-line errors for a file that is not one or that does not
    fit the run's classes and channels."""
    meta = teacher_record(path)
    if (meta["num_classes"], meta["in_chans"]) != (num_classes, in_chans):
        raise ValueError(
            f"{path}: the teacher has {meta['num_classes']} classes and {meta['in_chans']} channels, the run "
            f"{num_classes} and {in_chans}"
        )
    teacher = Teacher(meta["name"], num_classes, in_chans, meta["mean"], meta["std"], meta.get("img_size"))
    teacher.net.load_state_dict(load_file(str(path)))
    return teacher, meta


def check_teacher_name(name: str) -> None:
    """A timm model name, a teacher file, or pretrained weights (a weights file, a timm name with a tag), else a
    one-line error that names it."""
    if names_a_file(name, TENSOR_SUFFIXES):
        if not Path(name).is_file():
            raise ValueError(f"teacher={name!r}: no such file")
    if looks_pretrained(name):
        read_cnn_weights(name)  # readable, of a known layout, in the cache: or a one-line error saying what is expected
    elif not name.endswith(".safetensors") and not timm.is_model(name):
        raise ValueError(f"teacher={name!r}: neither a timm model name (timm.list_models()) nor a .safetensors file")


def epoch_batches(n: int, limit: int | float | None) -> int:
    """The batches of one of the teacher's epochs: the student's, as Lightning's `limit_train_batches` counts them
    (an int: that many; a float: that share of the loader; None: all). The trainer's own count is set only after
    `on_fit_start`, where the teacher trains."""
    if limit is None:
        return n
    if isinstance(limit, int):
        return max(1, min(n, limit))
    return max(1, int(n * limit))


class TeacherFit(L.Callback):
    """Trains (or loads) the module's teacher when fit starts; see the module docstring.

    Args:
        name: a timm CNN name (trained from scratch), pretrained weights (fine-tuned: vit/model/cnn_weights.py), or
            a teacher file written by an earlier run.
        share: of the time left before the deadline (a `FitBudget` callback's `deadline`), or of max_epochs.
        lr: AdamW's peak, cosine to 0 over the teacher's time (by the clock when there is a deadline); None: 1e-3
            from scratch, 5e-4 to fine-tune ImageNet weights.
        img_size: the side the teacher sees (the student's view resized); None: the student's.
        clock: time.time, replaceable in tests.
    """

    def __init__(self, name: str, share: float, lr: float | None = None, img_size: int | None = None, clock=time.time):
        self.name, self.share, self.img_size, self.clock = name, share, img_size, clock
        self.pretrained = looks_pretrained(name)
        self.lr = lr if lr is not None else (5e-4 if self.pretrained else 1e-3)
        self.record: dict = {}

    def on_fit_start(self, trainer: L.Trainer, pl_module) -> None:
        if pl_module.teacher is not None:  # already there (a second fit on the same module)
            return
        dm = trainer.datamodule
        cfg = pl_module.model.cfg
        mean = torch.tensor(pl_module.recipe.mean).view(1, -1, 1, 1)
        std = torch.tensor(pl_module.recipe.std).view(1, -1, 1, 1)
        folder = run_folder(trainer)
        resumed = trainer.ckpt_path is not None and (folder / TEACHER_FILE).is_file()
        reuse = self.name.endswith(".safetensors") and not self.pretrained  # a teacher file of an earlier run
        if reuse or resumed:  # that file, or the one this run wrote before it stopped
            path = self.name if reuse else folder / TEACHER_FILE
            teacher, self.record = load_teacher(path, cfg.num_classes, cfg.in_chans)
        else:
            if self.pretrained:
                teacher = pretrained_teacher(self.name, cfg.num_classes, cfg.in_chans, self.img_size)
            else:
                teacher = Teacher(
                    self.name,
                    cfg.num_classes,
                    cfg.in_chans,
                    mean.flatten().tolist(),
                    std.flatten().tolist(),
                    self.img_size,
                )
            teacher.to(pl_module.device)
            self.record = self.train(teacher, dm.train_dataloader(), trainer, pl_module.device, mean, std)
        teacher.to(pl_module.device).eval().requires_grad_(False)
        val = dm.val_dataloader()
        limit = epoch_batches(len(val), trainer.limit_val_batches)
        self.record.update(self.score(teacher, itertools.islice(val, limit), pl_module.device, mean, std))
        self.record = {"name": self.name, **self.record}
        if trainer.is_global_zero:
            r = self.record
            print(
                f"teacher: {self.name}, trained {r.get('epochs')} epochs in {r.get('seconds')} s; alone on the "
                f"validation set: accuracy {r['val_acc']:.4f}, balanced {r['val_acc_balanced']:.4f}"
            )
        pl_module.set_teacher(teacher, mean.to(pl_module.device), std.to(pl_module.device), self.record)
        if trainer.is_global_zero and not reuse and not resumed:
            folder.mkdir(parents=True, exist_ok=True)
            teacher.save(folder / TEACHER_FILE, **self.record)

    def train(
        self, teacher: Teacher, batches, trainer: L.Trainer, device: torch.device, mean: torch.Tensor, std: torch.Tensor
    ) -> dict:
        """On the student's batches (mean, std: their normalisation, (1, C, 1, 1)), by the clock when a budget
        callback holds a deadline, else by epochs: AdamW (timm's CNNs train well with it from scratch at 1e-3;
        ImageNet weights fine-tune at 5e-4), cosine to 0, label smoothing 0.1. Returns the record."""
        start = self.clock()
        deadline = next((cb.deadline for cb in trainer.callbacks if getattr(cb, "deadline", None)), None)
        seconds = (deadline - start) * self.share if deadline is not None else None
        epochs = None if seconds is not None else max(1, round(self.share * (trainer.max_epochs or 1)))
        per_epoch = epoch_batches(len(batches), trainer.limit_train_batches)
        opt = torch.optim.AdamW(teacher.parameters(), lr=self.lr, weight_decay=0.05)
        teacher.train()
        done, epoch, steps = 0.0, 0, 0
        while done < 1:
            if hasattr(batches, "set_epoch"):
                batches.set_epoch(10_000 + epoch)  # other draws than the student's epochs
            for x, y in batches:
                if seconds is not None:
                    done = (self.clock() - start) / seconds
                else:
                    done = (epoch + steps / per_epoch) / epochs
                if done >= 1 or steps >= per_epoch:
                    break
                for group in opt.param_groups:
                    group["lr"] = self.lr * 0.5 * (1 + math.cos(math.pi * done))
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                x = teacher.renormalise(x, mean.to(device), std.to(device))
                loss = F.cross_entropy(teacher(x), y, label_smoothing=0.1)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                steps += 1
            epoch, steps = epoch + 1, 0
            if seconds is None and epoch >= epochs:
                break
        return {"epochs": epoch, "seconds": round(self.clock() - start, 1)}

    @torch.no_grad()
    def score(self, teacher: Teacher, batches, device, mean: torch.Tensor, std: torch.Tensor) -> dict:
        """Accuracy and balanced accuracy of the teacher alone on the validation batches, with the module's own
        metrics (evaluation padding left out)."""
        acc, counts = TopKAccuracy(1).to(device), ConfusionCounts(teacher.num_classes).to(device)
        for x, y in batches:
            x, y = x.to(device), y.to(device)
            logits = teacher(teacher.renormalise(x, mean.to(device), std.to(device)))
            acc.update(logits, y)
            counts.update(logits, y)
        return {"val_acc": round(float(acc.compute()), 4), "val_acc_balanced": round(float(counts.compute()[0]), 4)}


def run_folder(trainer: L.Trainer) -> Path:
    """Where the run's checkpoints go (the teacher file goes beside them), else its log folder, else here."""
    ckpt = trainer.checkpoint_callback
    return Path(ckpt.dirpath if ckpt is not None and ckpt.dirpath else trainer.log_dir or ".")
