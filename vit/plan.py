"""Plan a whole training recipe for an image folder from the data, the machine and a time budget.

nnU-Net's idea on a ViT classifier: a dataset fingerprint turned into a recipe by explicit rules, no search at run time
beyond a few timed training steps of the candidate models (this machine's speed).

    fp = fingerprint("path/to/images")          # counts, classes, sizes, modes, mirror symmetry (~1 s / 10k files)
    machine = Machine.here()                    # device kind, cores or GPU memory
    plan = make_plan(fp, machine, budget_s=300) # the rules below; calibrates the candidates it needs
    print(plan.table())                         # what was measured, what was chosen, why
    plan.overrides                              # {"model.arch.embed_dim": 96, "trainer.max_epochs": 40, ...}

`vit-train fit --data.root PATH [--budget 5min]` plans this way (vit/commands/train.py), prints the table, and saves
the full config as <run>/plan.yaml; anything given on the command line or in a config file wins over the plan. The
measurements behind each rule are in docs/recipes.md.
"""

from __future__ import annotations

import math
import os
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vit.data import DataError
from vit.images import eval_geometry
from vit.model import VisionTransformer, ViTConfig
from vit.optim import MuonWithAdamW, split_for_muon
from vit.sources import DataSource, folder_source

# ---------------------------------------------------------------------------------------------------------------------
# The rule table. Each line: the rule, then the measurement behind it (docs/recipes.md has the sweeps).
# ---------------------------------------------------------------------------------------------------------------------

# Candidate models, smallest first: (embed_dim, depth, num_heads). The planner takes the largest one that the data
# allows (the tier's model index) and that still gets the tier's fewest epochs within the budget on this machine.
MODELS = [(64, 3, 2), (96, 4, 3), (128, 6, 4), (192, 6, 3), (256, 8, 4)]

# By training images: (up to n, largest model index, batch size, epochs wanted without a budget, fewest epochs worth
# training, crop scale, TrivialAugment, Random Erasing, Mixup/CutMix, optimizer, share of patch tokens dropped in the
# first PATCH_DROP_UNTIL of the epochs). docs/recipes.md has the sweeps:
# - small sets want epochs more than width: MNIST (8,000) in 5 minutes: 128x6 for 20 epochs 96.4%, 96x4 for ~45
#   epochs 97.80-98.25% (3 seeds), 64x3 for 63 epochs 98.2%; hence 30 epochs before a model is taken;
# - little augmentation for small sets: RandomResizedCrop from 35% + TrivialAugment cost MNIST 3 points (94.9%), and
#   the first round's folder.yaml (that recipe) reached 33% on MNIST and 49% on the digits folder in the same budgets;
# - 30k-200k, measured on 50,000 28-px grayscale clothing images in 15 minutes (docs/recipes.md, "At 60,000
#   images", seeds 0-2): the old rule (128x6 for 9-12 epochs here, crop from 35%, Random Erasing 0.25) 84.25-85.63%;
#   64x3 for 59-64 epochs with crop from 80% and no erasing 91.51-91.78%; 96x4 for 27-30 epochs with the same light
#   augmentation 90.49-90.90%; 64x3 at 49 tokens 3.5 points behind 16 tokens at 300 s (one seed); hence 40 epochs
#   before width. TrivialAugment stays on for colour images of this tier: not measured (the folder is grayscale);
#   Muon for the blocks' matrices (vit/optim.py) instead of AdamW: 91.94-92.21% in 45-47 epochs against AdamW's
#   91.51-91.78% in 59-64 (3 seeds each); batch 256 no faster per epoch and 0.34 points lower (3 seeds);
#   PatchDropout (timm's) of half the tokens for the first half of the epochs: those epochs take ~25% less time, so
#   ~25% more epochs fit (56-58 against 45-47): 92.39-92.70% (3 seeds) against the Muon plan's 91.94-92.21%;
#   not adopted, 3 seeds each: warmup-stable-decay (mean 92.15% against cosine's 92.11%), progressive resizing
#   (91.90%), an EMA of the weights (91.45% against AdamW's 91.69%);
# - the largest tier is timm/DeiT's regularisation for photos: not measured here (no such dataset offline).
# fmt: off
TIERS = [
    # n       model batch want  min  crop_scale   trivialaug erasing mixup  optimizer patch_drop
    (3_000,   1,    64,   60,   20,  (0.8, 1.0),  False,     0.0,    False, "adamw",  0.0),
    (30_000,  2,    128,  40,   30,  (0.8, 1.0),  False,     0.0,    False, "adamw",  0.0),
    (200_000, 3,    128,  50,   40,  (0.8, 1.0),  True,      0.0,    False, "muon",   0.5),
    (math.inf, 4,   256,  30,   8,   (0.35, 1.0), True,      0.25,   True,  "adamw",  0.0),
]
# fmt: on
# What each tier's plan reached where it was measured (docs/recipes.md), shown in the plan's table: a reference for
# what to expect, not a prediction for other data.
MEASURED = {
    3_000: "3 min: 99.4-99.7% (1,437 digits at 8-40 px, 3 seeds)",
    30_000: "5 min: 98.3-98.5% (8,000 28-px MNIST digits, 3 seeds)",
    200_000: "15 min: 92.4-92.7% (50,000 28-px grayscale clothing photos, 3 seeds)",
}

MEASURED_PHOTOS = "15 min: 75.4-81.5% (1,181 300-px grey electroluminescence photos, 3 folds)"

# Training resolution: the listed side at or above the median short side. Without a budget, a 4x4 token grid up to
# 32 px on a CPU, else 8x8. With one, the 8x8 grid at the images' own size only when it buys the tier's largest model
# its wanted epochs, else a 4x4 grid at most 32 px (token_grids): 64-px MNIST in 5 minutes, 3 seeds, 98.25-98.40%
# at 16 tokens against 95.90-97.80% at 64; 64-px Fashion-MNIST 20k, 89.58-89.64% against 83.22-83.52%
# (docs/recipes.md, "tokens by budget"). At 28 px, 49 tokens reached 95.8% against 16 tokens' 97.80-98.25%.
SIDES = [16, 24, 32, 48, 64, 96, 128]
# Photos: a median short side of PHOTO_SIDE px or more (no set the rules above were measured on comes near: they stop
# at 64 px) trains at PHOTO_GRID's (img_size, patch) behind a convolutional stem (ViTConfig.stem = "conv"), whatever
# the budget. 300-px grey photos, 15 min, 3 held-out folds: 78.1% / 75.4% (accuracy / balanced) against the old
# plan's 74.6% / 71.1%, better on every fold (docs/recipes.md, "Real photos").
PHOTO_SIDE = 128
PHOTO_GRID = (64, 16)
# Photos learn at a quarter of the digits' learning rate: on the cells 2e-3 left the training accuracy at 0.81 and the
# balanced accuracy at 67.0% (fold 0), 5e-4 reached 0.85 and 74.4% (docs/recipes.md, "Real photos").
PHOTO_LR = 5e-4
# ... and may take 4x the tier's wanted epochs (digits: 2x, where 120 epochs saturated at 99.4-99.7%): at 120 epochs
# the cells' training accuracy was still 0.81-0.85 under 8 poses of each image.
PHOTO_EPOCH_CAP = 4
OPTIMIZER_NAMES = {"adamw": "AdamW", "muon": "Muon + AdamW"}
# PatchDropout stops after this share of the epochs: the second half sees every token, as evaluation does. The plan's
# epochs are counted at full tokens; FitBudget adds the epochs that the faster early ones leave room for.
PATCH_DROP_UNTIL = 0.5
LR = 2e-3  # AdamW peak at batch 64-128 (configs/digits.yaml's); docs/recipes.md, "learning rate"
LABEL_SMOOTHING = 0.1  # these three: configs/digits.yaml's measured recipe, not swept again
WEIGHT_DECAY = 0.05
# Horizontal flips only when the classes look alike in a mirror: the class means (minus the overall mean) correlate
# with their own mirror images above this. MNIST measures 0.49, the digits folder 0.32, and flips cost MNIST 2.5
# points (95.45%); classes of natural photos average left- and right-facing views: near 1 (not measured here).
FLIP_SYMMETRY = 0.6
# Random quarter turns (with flips: the 8 symmetries of the square) when the class means correlate with their own
# quarter turns above this: the solar cells (ELPV) measure 0.96-0.99, MNIST 0.21, the digits folder 0.06,
# Fashion-MNIST -0.04 (a shirt has an up; its mirror symmetry is 0.76). docs/recipes.md, "Real photos".
TURN_SYMMETRY = 0.6
# Wall time besides the epochs: Lightning's start-up, sanity check, the last checkpoint and teardown (CPU, digits and
# MNIST folders: 4-7 s); and a real epoch over the timed model steps (augmentation, metrics, logging). 1.2 made MNIST
# epochs 15-25% pessimistic (7.6 s planned, 6.4 s run); FitBudget (vit/planned_run.py) corrects it inside warmup.
FIXED_S, EPOCH_OVERHEAD = 8.0, 1.2
# Below this ratio of the smallest to the largest class a folder is long-tailed: the best checkpoint is the one with
# the best balanced accuracy, and its logits are adjusted post hoc for the training prior (Menon et al., 2021;
# vit/logit_adjustment.py): +4.5-7 points on Fashion-MNIST-LT100, 3 seeds (docs/recipes.md).
LONG_TAIL_BALANCE = 0.5

# bf16 autocast is taken when its measured training step is this much faster than fp32's (a margin over the noise of
# a few timed steps; it also rounds differently, so it must buy something).
BF16_GAIN = 1.1


@dataclass
class Fingerprint:
    """What the planner knows about a data source, read from its counts, headers and a small decoded sample."""

    root: str  # the data, as the plan names it: a folder, `torch/mnist in data/`, ...
    n_train: int
    n_val: int
    class_counts: list[int]
    median_side: int  # median over files of min(height, width)
    min_side: int
    max_side: int
    grayscale: float  # fraction of files that are grayscale (modes L, LA, I, I;16, 1, or palettes of greys)
    mirror_symmetry: float  # see FLIP_SYMMETRY
    decode_s: float  # measured seconds to decode the whole set once at start (threads); 0: held as arrays, streamed
    in_chans: int = 3  # channels the model trains on (1: a grayscale torchvision set)
    turn_symmetry: float = 0.0  # the same for a quarter turn: see TURN_SYMMETRY

    @property
    def num_classes(self) -> int:
        return len(self.class_counts)

    @property
    def balance(self) -> float:
        return min(self.class_counts) / max(self.class_counts)


@dataclass
class Machine:
    device: str  # "cpu" or "cuda"
    cores: int
    gpu: str = ""
    gpu_mem_gb: float = 0.0

    @staticmethod
    def here() -> Machine:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            return Machine("cuda", cores, p.name, p.total_memory / 2**30)
        return Machine("cpu", cores)

    def __str__(self) -> str:
        return f"{self.gpu} ({self.gpu_mem_gb:.0f} GB)" if self.device == "cuda" else f"CPU, {self.cores} cores"


@dataclass
class Plan:
    overrides: dict[str, Any]  # dotted config key -> value
    rows: list[tuple[str, str, str]] = field(default_factory=list)  # (what, value, why)
    estimate_s: float = 0.0  # planned wall time from process start to exit
    epoch_s: float = 0.0  # planned seconds per epoch (training + validation)
    cap: int = 0  # most epochs the budget may stretch the run to

    def table(self) -> str:
        w = max(len(r[0]) for r in self.rows)
        v = max(len(r[1]) for r in self.rows)
        return "\n".join(f"  {a:<{w}}  {b:<{v}}  {c}" for a, b, c in self.rows)


def parse_budget(text: str | int | float | None) -> float | None:
    """'5min', '300s', '1.5h', '90' (seconds), Lightning's 'DD:HH:MM:SS' or a {'minutes': 5} dict -> seconds."""
    if text is None or text == "":
        return None
    if isinstance(text, dict):
        from datetime import timedelta

        return timedelta(**text).total_seconds()
    if isinstance(text, int | float):
        seconds = float(text)
    elif re.fullmatch(r"\d+:\d+:\d+:\d+", str(text)):
        d, h, m, s = (int(x) for x in str(text).split(":"))
        seconds = ((d * 24 + h) * 60 + m) * 60 + s
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|sec|secs|seconds?|m|min|mins|minutes?|h|hr|hours?)?\s*", str(text))
        if not m:
            raise ValueError(f"budget={text!r}: expected a duration such as 300s, 5min or 1.5h")
        unit = (m.group(2) or "s")[0]
        seconds = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[unit]
    if seconds <= 0:
        raise ValueError(f"budget={text!r} must be positive")
    return seconds


def process_start() -> float:
    """time.time() when this process started (Linux /proc), so a budget counts the imports too; elsewhere: now."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


# ---------------------------------------------------------------------------------------------------------------------
# Fingerprint
# ---------------------------------------------------------------------------------------------------------------------


def fingerprint(
    source: DataSource | str | Path, val_fraction: float = 0.2, sample: int = 2000, seed: int = 0
) -> Fingerprint:
    """What the plan needs to know about a data source (a folder path, or any DataSource of vit/sources.py): counts
    from the source, sizes and modes from up to `sample` seeded items (file headers where there are files), mirror
    symmetry and decode speed from up to 50 of those per class, decoded at 16 px in threads. A torchvision dataset
    and the same images as a folder give the same fingerprint."""
    src = folder_source(source, val_fraction) if isinstance(source, str | Path) else source
    g = torch.Generator().manual_seed(seed)
    pick = torch.randperm(src.n_items, generator=g)[:sample].tolist()
    headers = [h for h in (src.header(i) for i in pick) if h is not None]
    if not headers:
        raise DataError(f"{src.name}: none of {len(pick)} sampled images could be read")
    sides = sorted(min(w, h) for w, h, _ in headers)

    per_class: dict[int, list[int]] = {}
    for i in pick:
        idx = per_class.setdefault(src.label(i), [])  # one label read an item: a stream's reads fetch its chunk
        if len(idx) < 50:
            idx.append(i)
    items = [i for idx in per_class.values() for i in idx]
    labels = [t for t, idx in per_class.items() for _ in idx]
    geometry = eval_geometry(16)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 1) + 2)) as pool:  # PIL releases the GIL
        images = list(pool.map(lambda i: None if (im := src.image(i)) is None else geometry(im), items))
    per_image = (time.perf_counter() - t0) / max(1, len(items))
    return Fingerprint(
        root=src.name,
        n_train=src.n_train,
        n_val=src.n_val,
        class_counts=list(src.class_counts),
        median_side=int(statistics.median(sides)),
        min_side=sides[0],
        max_side=sides[-1],
        grayscale=sum(gray for *_, gray in headers) / len(headers),
        mirror_symmetry=mirror_symmetry(images, labels),
        turn_symmetry=mirror_symmetry(images, labels, turn=True),
        decode_s=per_image * (src.n_train + src.n_val) if src.decodes else 0.0,
        in_chans=src.in_chans,
    )


def mirror_symmetry(images: list[torch.Tensor | None], labels: list[int], turn: bool = False) -> float:
    """How much the classes look like their own mirror images: the class means minus the overall mean, d_c, against
    their left-right flips: sum_c <d_c, flip(d_c)> / sum_c |d_c|^2, in [-1, 1]. 1: every class is mirror-symmetric
    on average (flipping an image keeps it in its class); near 0 or below: the classes have a handedness. `turn`: the
    same against a quarter turn of d_c (what tells a tile or a slide, whose classes keep under turns, from a digit or
    a photo with an up). What the classes share (grid lines every image has, a photo's sky) is in the overall mean and
    cancels."""
    kept = [(img.float().mean(0), t) for img, t in zip(images, labels) if img is not None]
    if len(kept) < 2:
        return 1.0
    x = torch.stack([img for img, _ in kept])  # (N, 16, 16) grey
    y = torch.tensor([t for _, t in kept])
    overall = x.mean(0)
    num = den = 0.0
    for c in y.unique():
        d = x[y == c].mean(0) - overall
        num += float((d * (torch.rot90(d, 1, (-2, -1)) if turn else d.flip(-1))).sum())
        den += float((d * d).sum())
    return num / den if den > 0 else 1.0


# ---------------------------------------------------------------------------------------------------------------------
# Speed calibration
# ---------------------------------------------------------------------------------------------------------------------


def calibrate(
    archs: list[ViTConfig],
    batch_size: int,
    device: str = "cpu",
    precision: str = "32-true",
    optimizer: str = "adamw",
    steps: int = 3,
    warmup: int = 2,
) -> list[float]:
    """Training images/s of each architecture on this machine at `precision` (Lightning's name: "32-true", or
    "bf16-mixed" for bf16 autocast): `warmup` + `steps` steps of `optimizer` ("adamw" or "muon": Muon costs ~15% of a
    64x3 step on a 2-core CPU) on a random batch, the median step. The global RNG is left as it was, so that planning
    does not change the seeded run that follows."""
    speeds = []
    # the CUDA generator too (dropout and DropPath of the calibration steps draw from it on a GPU)
    with torch.random.fork_rng(devices=[torch.device(device)] if torch.device(device).type == "cuda" else []):
        for cfg in archs:
            model = VisionTransformer(cfg).to(device)
            if optimizer == "muon":
                opt = MuonWithAdamW(*split_for_muon(model, [{"params": list(model.parameters())}]), lr=1e-4)
            else:
                opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            x = torch.randn(batch_size, cfg.in_chans, cfg.img_size, cfg.img_size, device=device)
            y = torch.randint(0, max(1, cfg.num_classes), (batch_size,), device=device)
            times = []
            for i in range(warmup + steps):
                t = time.perf_counter()
                with torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                if device == "cuda":
                    torch.cuda.synchronize()  # calibration only: the training hot path never waits
                if i >= warmup:
                    times.append(time.perf_counter() - t)
            speeds.append(batch_size / statistics.median(times))
            del model, opt
    return speeds


# ---------------------------------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------------------------------


def warmup_epochs(epochs: int) -> int:
    """5% of the epochs (digits.yaml's 3 of 60), at least one (so that FitBudget resizes the run inside warmup), at
    most 5 (DeiT's)."""
    return max(1, min(5, round(0.05 * epochs)))


def tier(n_train: int) -> tuple:
    return next(t for t in TIERS if n_train <= t[0])


def resolution(median_side: int, device: str = "cpu") -> tuple[int, int]:
    """(img_size, patch_size): the median short side itself when the token grid divides it (28 px: 4x4 tokens of 7 px),
    else the listed side at or above it (up to 128); a 4x4 grid of tokens up to 32 px on a CPU, else 8x8 (a GPU
    affords CIFAR's usual patch 4 at 32 px: not measured here, no GPU)."""
    side = next((s for s in SIDES if s >= median_side), SIDES[-1])
    grid = 4 if side <= 32 and device == "cpu" else 8
    if 16 <= median_side <= side and median_side % grid == 0:
        side = median_side  # the images' own size: no resampling blur, each token a whole block of pixels
    return side, side // grid


def token_grids(median_side: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The two (img_size, patch_size) a budget chooses between: a 4x4 token grid at most 32 px (the images' own size
    when 4 divides it: 28 px -> patch 7; 64 px -> 32 px, patch 8), and the 8x8 grid at the images' own size (up to
    128 px: 64 px -> patch 8; 28 px -> 32 px, patch 4)."""
    few = resolution(min(median_side, 32), "cpu")
    return few, resolution(median_side, "cuda")


def make_plan(
    fp: Fingerprint,
    machine: Machine,
    budget_s: float | None = None,
    elapsed_s: float = 0.0,
    speed_fn=None,
) -> Plan:
    """The recipe for `fp` on `machine`. With `budget_s` (wall seconds from process start to exit, of which
    `elapsed_s` are spent), the largest allowed model that still trains MIN epochs, and as many epochs as fit (at most
    the tier's wanted epochs x 2); without, the tier's model and epochs. `speed_fn(archs, batch)` -> images/s
    (default: `calibrate` on this machine; tests pass a fake)."""
    max_n, max_model, batch, want, min_epochs, crop_scale, trivial, erasing, mixup, optimizer, patch_drop = tier(
        fp.n_train
    )
    if machine.device == "cuda" and fp.n_train > 30_000:
        batch = max(batch, 256)  # a GPU wants bigger batches; under 30k images they would leave too few steps
    batch = max(1, min(batch, fp.n_train // 8))  # at least 8 steps per epoch on tiny data
    hflip = fp.mirror_symmetry >= FLIP_SYMMETRY
    rot90 = fp.turn_symmetry >= TURN_SYMMETRY
    speed_fn = speed_fn or (lambda a, b, precision="32-true": calibrate(a, b, machine.device, precision, optimizer))

    photo = fp.median_side >= PHOTO_SIDE
    stem = "conv" if photo else "patch"
    lr = PHOTO_LR if photo else LR
    most = (PHOTO_EPOCH_CAP if photo else 2) * want  # the most epochs a budget may buy

    def candidates(img_size: int, patch: int) -> list[ViTConfig]:
        return [
            ViTConfig(
                img_size=img_size,
                patch_size=patch,
                stem=stem,
                in_chans=fp.in_chans,
                num_classes=fp.num_classes,
                embed_dim=w,
                depth=d,
                num_heads=h,
            )
            for w, d, h in MODELS[: max_model + 1]
        ]

    def epoch_seconds(speed: float) -> float:
        # training at the timed speed plus overhead; validation forward-only, ~3x faster than a training step
        return (fp.n_train / speed) * EPOCH_OVERHEAD + fp.n_val / (3 * speed)

    few, full = token_grids(fp.median_side)
    if photo:
        # Images far larger than any grid a CPU can afford: a fixed side and grid behind a convolutional stem, with
        # or without a budget (no timing decides it, so a busy machine cannot flip it) (docs/recipes.md, "Real
        # photos": 300-px solar cells).
        img_size, patch = PHOTO_GRID
        why_grid = f"images of {fp.median_side} px >= {PHOTO_SIDE}: a convolutional stem to a 4x4 grid at {img_size} px"
    elif budget_s is None:
        img_size, patch = resolution(fp.median_side, machine.device)
        why_grid = "no --budget: a 4x4 grid up to 32 px on a CPU, else 8x8"
    else:
        # The image's own grid only when the budget buys the tier's whole recipe (its largest model for its wanted
        # epochs) at those tokens; else fewer tokens and more epochs (docs/recipes.md, "Tokens by budget").
        largest = candidates(*full)[-1:]
        t0 = time.perf_counter()
        full_speed = speed_fn(largest, batch)[0]
        elapsed_s += time.perf_counter() - t0
        spare_full = budget_s - elapsed_s - fp.decode_s - FIXED_S
        full_epochs = spare_full / epoch_seconds(full_speed)
        img_size, patch = full if full_epochs >= want else few
        why_grid = (
            f"{(full[0] // full[1]) ** 2} tokens would give {MODELS[max_model][0]}x{MODELS[max_model][1]} "
            f"{max(0.0, full_epochs):.0f} of its {want} epochs in the budget"
        )
    archs = candidates(img_size, patch)
    t0 = time.perf_counter()
    speeds = speed_fn(archs, batch)
    elapsed_s += time.perf_counter() - t0

    spare = None
    if budget_s is not None:
        spare = budget_s - elapsed_s - fp.decode_s - FIXED_S
        need = budget_s - spare + 2 * epoch_seconds(speeds[0])
        if spare < 2 * epoch_seconds(speeds[0]):  # less than two epochs of the smallest model: no real schedule
            raise ValueError(
                f"budget={budget_s:.0f}s is too short for {fp.root}: start-up and decoding take "
                f"~{budget_s - spare:.0f} s and an epoch of the smallest model ~{epoch_seconds(speeds[0]):.0f} s; "
                f"give at least {math.ceil(need)}s"
            )
        choice = 0
        for i in reversed(range(len(archs))):
            if spare / epoch_seconds(speeds[i]) >= min_epochs:
                choice = i
                break
        epochs = int(max(1, min(most, spare // epoch_seconds(speeds[choice]))))
        why_model = f"largest of {len(archs)} candidates with >= {min_epochs} epochs in the budget"
        why_epochs = f"as many as fit in the {budget_s:.0f} s budget (at most {most})"
    else:
        choice, epochs = max_model, want
        why_model = f"largest candidate for {fp.n_train} training images"
        why_epochs = f"wanted for {fp.n_train} images (no --budget)"
    # Precision, measured on the chosen model: bf16 autocast is several times faster on GPUs and on CPUs with AMX,
    # slower on others (this project's 2-core Xeon with AVX512-BF16: 0.65x at 64x3, 0.96x at 128x6, 2026-12-01).
    t0 = time.perf_counter()
    bf16 = speed_fn([archs[choice]], batch, "bf16-mixed")[0]
    elapsed_s += time.perf_counter() - t0
    precision = "bf16-mixed" if bf16 > BF16_GAIN * speeds[choice] else "32-true"
    fp32_speed = speeds[choice]
    if precision == "bf16-mixed":
        speeds = [*speeds[:choice], bf16, *speeds[choice + 1 :]]
        if spare is not None:
            epochs = int(max(1, min(most, spare // epoch_seconds(bf16))))
    w, d, h = MODELS[choice]
    epoch_s = epoch_seconds(speeds[choice])
    warmup = warmup_epochs(epochs)
    drop_path = 0.05 if d <= 4 else 0.1
    every = max(1, epochs // 5)  # attention maps five times a run: they cost a forward and a backward each time

    overrides = {
        "data.init_args.img_size": img_size,
        "data.init_args.batch_size": batch,
        "data.init_args.eval_batch_size": max(batch, 256),
        "data.init_args.hflip": hflip,
        "data.init_args.rot90": rot90,
        "data.init_args.crop_scale": list(crop_scale),
        "data.init_args.auto_augment": "trivialaugment" if trivial and fp.grayscale < 0.5 else "none",
        "data.init_args.random_erasing": erasing,
        "model.arch.patch_size": patch,
        "model.arch.stem": stem,
        "model.arch.embed_dim": w,
        "model.arch.depth": d,
        "model.arch.num_heads": h,
        "model.arch.drop_path_rate": drop_path,
        "model.lr": lr,
        "model.optimizer": optimizer,
        "model.arch.patch_drop_rate": patch_drop,
        "model.patch_drop_until": PATCH_DROP_UNTIL if patch_drop else 1.0,
        "model.weight_decay": WEIGHT_DECAY,
        "model.warmup_epochs": warmup,
        "model.label_smoothing": LABEL_SMOOTHING,
        "model.mixup_alpha": 0.8 if mixup else 0.0,
        "model.cutmix_alpha": 1.0 if mixup else 0.0,
        "trainer.max_epochs": epochs,
        "trainer.precision": precision,
        "attention_maps.every_n_epochs": every,
    }
    speed_text = ", ".join(f"{a.embed_dim}x{a.depth}: {s:.0f}" for a, s in zip(archs, speeds))
    gray = "grayscale" if fp.grayscale >= 0.5 else "colour"
    rows = [
        ("data", f"{fp.n_train} train / {fp.n_val} val, {fp.num_classes} classes", f"class balance {fp.balance:.2f}"),
        ("image sides", f"median {fp.median_side} px", f"{fp.min_side}-{fp.max_side} px, {gray}"),
        (
            "symmetry",
            f"mirror {fp.mirror_symmetry:.2f}, quarter turn {fp.turn_symmetry:.2f}",
            f"flips when >= {FLIP_SYMMETRY}, turns when >= {TURN_SYMMETRY}",
        ),
        ("machine", str(machine), f"decode ~{fp.decode_s:.0f} s"),
        ("speed (img/s)", speed_text, f"training steps at batch {batch}, fp32, {OPTIMIZER_NAMES[optimizer]}"),
        (
            "precision",
            precision,
            f"{w}x{d} measured: fp32 {fp32_speed:.0f} img/s, bf16 {bf16:.0f} img/s (bf16 when > {BF16_GAIN}x)",
        ),
        ("img_size, patch", f"{img_size}, {patch}", f"{(img_size // patch) ** 2} tokens: {why_grid}"),
        ("model", f"{w} wide, {d} blocks, {h} heads", why_model),
        ("epochs", str(epochs), why_epochs + f"; ~{epoch_s:.1f} s each"),
        ("batch, lr, warmup", f"{batch}, {lr:g}, {warmup} ep", f"{OPTIMIZER_NAMES[optimizer]}, cosine to 1%"),
        (
            "augmentation",
            f"crop {crop_scale[0]:g}-1, flip {'on' if hflip else 'off'}, turns {'on' if rot90 else 'off'}, "
            f"{overrides['data.init_args.auto_augment']}"
            + (f", erasing {erasing:g}" if erasing else "")
            + (", mixup/cutmix" if mixup else ""),
            f"for {fp.n_train} images",
        ),
        ("regularisation", f"label smoothing {LABEL_SMOOTHING}, drop path {drop_path}, wd {WEIGHT_DECAY}", ""),
    ]
    if fp.balance < LONG_TAIL_BALANCE:
        overrides["model.posthoc_logit_adjust"] = True
        overrides["checkpoint.monitor"] = "val/acc_balanced"
        rows.append(
            (
                "long tail",
                "best checkpoint by val/acc_balanced, then post-hoc logit adjustment (tau chosen on val)",
                f"class balance {fp.balance:.2f} < {LONG_TAIL_BALANCE} (docs/recipes.md)",
            )
        )
    if patch_drop:
        rows.append(
            (
                "patch dropout",
                f"{patch_drop:g} of the tokens, first {PATCH_DROP_UNTIL:g} of the epochs",
                "faster early epochs, so more of them (epochs and estimate count full tokens)",
            )
        )
    estimate = elapsed_s + fp.decode_s + FIXED_S + epochs * epoch_s
    rows.append(
        (
            "estimate",
            f"{estimate:.0f} s wall" + ("" if budget_s else f" (~{estimate / 60:.0f} min on this machine)"),
            "start to exit" + (f", budget {budget_s:.0f} s" if budget_s else ""),
        )
    )
    if photo:  # the digits' numbers of the same tier would say nothing about photos
        rows.append(("measured", f"held-out accuracy on 2 CPU cores, {MEASURED_PHOTOS}", "docs/recipes.md"))
    elif max_n in MEASURED:
        rows.append(("measured", f"best val/acc on 2 CPU cores, {MEASURED[max_n]}", "docs/recipes.md"))
    else:
        rows.append(("measured", "this tier: not measured (no set of this size here)", "docs/recipes.md"))
    if machine.device == "cuda":  # every rule was measured on 2 CPU cores; a GPU's side of them is as written
        rows.append(("on a GPU", "rules as written, not measured on one (batch 256 from 30,000 images)", ""))
    return Plan(overrides=overrides, rows=rows, estimate_s=estimate, epoch_s=epoch_s, cap=most)
