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
import time
from dataclasses import dataclass, field
from typing import Any

from vit.model.config import ViTConfig
from vit.model.patch_embed import patch_grid
from vit.planning.fingerprint import Fingerprint
from vit.planning.precision import decide_precision
from vit.planning.speed import Machine, calibrate

# ---------------------------------------------------------------------------------------------------------------------
# The rule table. Each line: the rule, then the measurement behind it (docs/recipes.md has the sweeps).
# ---------------------------------------------------------------------------------------------------------------------

# Candidate models, smallest first: (embed_dim, depth, num_heads). The planner takes the largest one that the data
# allows (the tier's model index) and that still gets the tier's fewest epochs within the budget on this machine.
MODELS = [(64, 3, 2), (96, 4, 3), (128, 6, 4), (192, 6, 3), (256, 8, 4)]

# By training images: (up to n, largest model index, batch size, epochs wanted without a budget, fewest epochs worth
# training, crop scale, TrivialAugment, Random Erasing, Mixup/CutMix, optimizer, share of patch tokens dropped in the
# first PATCH_DROP_UNTIL of the epochs). The measurements (docs/recipes.md, "Small folders" and "At 60,000 images"):
# - small sets want epochs more than width: MNIST (8,000) in 5 minutes, 96x4 for ~45 epochs 97.80-98.25% (3 seeds)
#   against 128x6 for 20 epochs 96.4%; hence 30 epochs before a larger model is taken;
# - little augmentation for small sets: RandomResizedCrop from 35% and TrivialAugment cost MNIST 3 points (94.9%);
# - 30k-200k (50,000 28-px grayscale clothing images, 15 minutes, seeds 0-2): 64x3 for 59-64 epochs with crops from
#   80% and no erasing 91.51-91.78% against 128x6 for 9-12 epochs with crops from 35% and erasing 84.25-85.63%, and
#   96x4 for 27-30 epochs 90.49-90.90%: 40 epochs before width; Muon for the blocks' matrices (vit/training/optim.py)
#   91.94-92.21% against AdamW's 91.51-91.78%; PatchDropout of half the tokens for the first half of the epochs buys
#   ~25% more epochs: 92.39-92.70%. TrivialAugment is on for colour images of this tier without a measurement (the
#   folder is grayscale);
# - the largest tier is timm/DeiT's regularisation for photos, without a measurement here (no such dataset offline).
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

MEASURED_PHOTOS = "15 min: 78.5-82.3%, balanced 74.0-76.6% (1,181 300-px grey electroluminescence photos, 3 folds)"

# Training resolution: the listed side at or above the median short side. Without a budget, a 4x4 token grid up to
# 32 px on a CPU, else 8x8. With one, the 8x8 grid at the images' own size only when it buys the tier's largest model
# its wanted epochs, else a 4x4 grid at most 32 px (token_grids): 64-px MNIST in 5 minutes, 3 seeds, 98.25-98.40%
# at 16 tokens against 95.90-97.80% at 64; 64-px Fashion-MNIST 20k, 89.58-89.64% against 83.22-83.52%
# (docs/recipes.md, "tokens by budget"). At 28 px, 49 tokens reached 95.8% against 16 tokens' 97.80-98.25%.
SIDES = [16, 24, 32, 48, 64, 96, 128]
# Photos: a median short side of PHOTO_SIDE px or more (no set the rules above were measured on comes near: they stop
# at 64 px) trains at PHOTO_GRID's (img_size, patch) behind a convolutional stem (ViTConfig.stem = "conv"), whatever
# the budget. 300-px grey photos, 15 min, 3 held-out folds: 78.1% / 75.4% (accuracy / balanced) against 74.6% / 71.1%
# for the small-image grid at 64 px, better on every fold (docs/recipes.md, "Real photos").
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
# A forward-only pass (validation, the maps, the passes after fit) costs about a third of a training step an image:
# the backward pass does about twice the forward's work.
FORWARD_SHARE = 1 / 3
# Costly steps (a CNN stem, a large pretrained ViT: ~10x a small ViT's on a CPU) are timed at this batch, not the run's
CALIBRATION_BATCH = 16
# Wall time besides the epochs: Lightning's start-up, sanity check, the last checkpoint and teardown (CPU, digits and
# MNIST folders: 4-7 s); and a real epoch over the timed model steps (augmentation, metrics, logging). 1.2 made MNIST
# epochs 15-25% pessimistic (7.6 s planned, 6.4 s run); FitBudget (vit/run/planned.py) corrects it inside
# warmup.
FIXED_S, EPOCH_OVERHEAD = 8.0, 1.2
# Below this ratio of the smallest to the largest class a folder is long-tailed: the best checkpoint is the one with
# the best balanced accuracy, and its logits are adjusted post hoc for the training prior (Menon et al., 2021;
# vit/evaluation/logit_adjustment.py; kept only where a bootstrap of the validation set finds the gain beyond its
# noise): +4.5-7 points on Fashion-MNIST-LT100, 3 seeds (docs/recipes.md).
LONG_TAIL_BALANCE = 0.5
# The attention-map callback's deletion measure runs 2 maps x 33 forward passes an image each time it logs: the plan
# gives it images for at most MAP_SHARE of the training time (a forward FORWARD_SHARE of a training step). On the
# hybrid at 192 px its default 32 images took ~90 s a log, 3 of the 15 minutes.
MAP_SHARE = 0.02
MAP_LOGS = 5
MAP_IMAGES = 32


@dataclass
class Plan:
    overrides: dict[str, Any]  # dotted config key -> value
    rows: list[tuple[str, str, str]] = field(default_factory=list)  # (what, value, why)
    estimate_s: float = 0.0  # planned wall time from process start to exit
    epoch_s: float = 0.0  # planned seconds per epoch (training + validation)
    cap: int = 0  # most epochs the budget may stretch the run to
    after_fit_s: float = 0.0  # planned seconds of the passes after fit (calibration, unknown statistics, test)

    def table(self) -> str:
        w = max(len(r[0]) for r in self.rows)
        v = max(len(r[1]) for r in self.rows)
        return "\n".join(f"  {a:<{w}}  {b:<{v}}  {c}" for a, b, c in self.rows)


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
    return Planner(fp, machine, budget_s, elapsed_s, speed_fn).plan()


class Planner:
    """make_plan's steps, in the order they run: the tier's recipe, the token grid, the model and epochs that fit,
    the precision, then the overrides and the table that says why. Timed calibration adds to `elapsed_s`."""

    def __init__(self, fp: Fingerprint, machine: Machine, budget_s: float | None, elapsed_s: float, speed_fn=None):
        self.fp, self.machine, self.budget_s, self.elapsed_s = fp, machine, budget_s, elapsed_s
        (
            self.max_n,
            self.max_model,
            batch,
            self.want,
            self.min_epochs,
            self.crop_scale,
            self.trivial,
            self.erasing,
            self.mixup,
            self.optimizer,
            self.patch_drop,
        ) = tier(fp.n_train)
        if machine.device == "cuda" and fp.n_train > 30_000:
            batch = max(batch, 256)  # a GPU wants bigger batches; under 30k images they would leave too few steps
        self.batch = max(1, min(batch, fp.n_train // 8))  # at least 8 steps per epoch on tiny data
        self.hflip = fp.mirror_symmetry >= FLIP_SYMMETRY
        self.rot90 = fp.turn_symmetry >= TURN_SYMMETRY
        self.speed_fn = speed_fn or (
            lambda a, b, precision="32-true": calibrate(a, b, machine.device, precision, self.optimizer)
        )
        self.photo = fp.median_side >= PHOTO_SIDE
        self.stem = "conv" if self.photo else "patch"
        self.lr = PHOTO_LR if self.photo else LR
        self.models = MODELS  # (embed_dim, depth, num_heads) to choose from; a fine-tune has its weights' one
        self.epoch_overhead = EPOCH_OVERHEAD
        self.most = (PHOTO_EPOCH_CAP if self.photo else 2) * self.want  # the most epochs a budget may buy

    def plan(self) -> Plan:
        self.choose_grid()
        self.choose_model_and_epochs()
        self.choose_precision()
        overrides = self.overrides()
        rows = self.rows(overrides)
        return Plan(
            overrides=overrides,
            rows=rows,
            estimate_s=self.estimate,
            epoch_s=self.epoch_s,
            cap=self.most,
            after_fit_s=getattr(self, "after_fit", 0.0),
        )

    def candidates(self, img_size: int, patch: int) -> list[ViTConfig]:
        return [
            ViTConfig(
                img_size=img_size,
                patch_size=patch,
                stem=self.stem,
                in_chans=self.fp.in_chans,
                num_classes=self.fp.num_classes,
                embed_dim=w,
                depth=d,
                num_heads=h,
            )
            for w, d, h in self.models[: self.max_model + 1]
        ]

    def epoch_seconds(self, speed: float) -> float:
        # training at the timed speed plus overhead; validation forward-only (FORWARD_SHARE of a step an image)
        return (self.fp.n_train / speed) * self.epoch_overhead + self.fp.n_val * FORWARD_SHARE / speed

    def timing_batch(self) -> int:
        """The batch the calibration steps time: the run's own (a planner of costly steps times fewer images)."""
        return self.batch

    def timed(self, archs: list[ViTConfig], precision: str = "32-true") -> list[float]:
        t0, batch = time.perf_counter(), self.timing_batch()
        speeds = self.speed_fn(archs, batch) if precision == "32-true" else self.speed_fn(archs, batch, precision)
        self.elapsed_s += time.perf_counter() - t0
        return speeds

    def spare_s(self) -> float:
        return self.budget_s - self.elapsed_s - self.fp.decode_s - FIXED_S

    def choose_grid(self) -> None:
        fp = self.fp
        few, full = token_grids(fp.median_side)
        if self.photo:
            # Images far larger than any grid a CPU can afford: a fixed side and grid behind a convolutional stem,
            # with or without a budget (no timing decides it, so a busy machine cannot flip it) (docs/recipes.md,
            # "Real photos": 300-px solar cells).
            self.img_size, self.patch = PHOTO_GRID
            side = f"images of {fp.median_side} px >= {PHOTO_SIDE}"
            self.why_grid = f"{side}: a convolutional stem to a 4x4 grid at {self.img_size} px"
        elif self.budget_s is None:
            self.img_size, self.patch = resolution(fp.median_side, self.machine.device)
            self.why_grid = "no --budget: a 4x4 grid up to 32 px on a CPU, else 8x8"
        else:
            # The image's own grid only when the budget buys the tier's whole recipe (its largest model for its
            # wanted epochs) at those tokens; else fewer tokens and more epochs (docs/recipes.md, "Tokens by budget").
            full_speed = self.timed(self.candidates(*full)[-1:])[0]
            full_epochs = self.spare_s() / self.epoch_seconds(full_speed)
            self.img_size, self.patch = full if full_epochs >= self.want else few
            w, d, _ = self.models[self.max_model]
            self.why_grid = (
                f"{(full[0] // full[1]) ** 2} tokens would give {w}x{d} "
                f"{max(0.0, full_epochs):.0f} of its {self.want} epochs in the budget"
            )

    def choose_model_and_epochs(self) -> None:
        self.archs = self.candidates(self.img_size, self.patch)
        self.speeds = self.timed(self.archs)
        self.spare = None
        if self.budget_s is None:
            self.choice, self.epochs = self.max_model, self.want
            self.why_model = f"largest candidate for {self.fp.n_train} training images"
            self.why_epochs = f"wanted for {self.fp.n_train} images (no --budget)"
            return
        spare = self.spare = self.spare_s()
        smallest = self.epoch_seconds(self.speeds[0])
        if spare < 2 * smallest:  # less than two epochs of the smallest model: no real schedule
            raise ValueError(
                f"budget={self.budget_s:.0f}s is too short for {self.fp.root}: start-up and decoding take "
                f"~{self.budget_s - spare:.0f} s and an epoch of the smallest model ~{smallest:.0f} s; "
                f"give at least {math.ceil(self.budget_s - spare + 2 * smallest)}s"
            )
        fits = [i for i in range(len(self.archs)) if spare / self.epoch_seconds(self.speeds[i]) >= self.min_epochs]
        self.choice = fits[-1] if fits else 0
        self.epochs = int(max(1, min(self.most, spare // self.epoch_seconds(self.speeds[self.choice]))))
        self.why_model = f"largest of {len(self.archs)} candidates with >= {self.min_epochs} epochs in the budget"
        self.why_epochs = f"as many as fit in the {self.budget_s:.0f} s budget (at most {self.most})"

    def choose_precision(self) -> None:
        # vit/planning/precision.py's rule: bf16 on a GPU that has it; fp32 on a CPU whose flags say bf16 is emulated
        # (not timed: the flags answer); else the chosen model timed in both, bf16 where BF16_GAIN faster.
        arch, self.fp32_speed = self.archs[self.choice], self.speeds[self.choice]
        self.bf16 = None
        if self.machine.device == "cuda" or self.machine.native_bf16 is not False:
            self.bf16 = self.timed([arch], "bf16-mixed")[0]
        self.precision, self.why_precision = decide_precision(
            self.machine.device, lambda: (self.fp32_speed, self.bf16), native=lambda: self.machine.native_bf16
        )
        if self.precision == "bf16-mixed":
            self.speeds = [*self.speeds[: self.choice], self.bf16, *self.speeds[self.choice + 1 :]]
            if self.spare is not None:
                self.epochs = int(max(1, min(self.most, self.spare // self.epoch_seconds(self.bf16))))
        self.epoch_s = self.epoch_seconds(self.speeds[self.choice])
        self.estimate = self.elapsed_s + self.fp.decode_s + FIXED_S + self.epochs * self.epoch_s

    def overrides(self) -> dict[str, Any]:
        w, d, h = self.models[self.choice]
        self.drop_path = 0.05 if d <= 4 else 0.1
        self.warmup = warmup_epochs(self.epochs)
        overrides = {
            "data.init_args.img_size": self.img_size,
            "data.init_args.batch_size": self.batch,
            "data.init_args.eval_batch_size": max(self.batch, 256),
            "data.init_args.hflip": self.hflip,
            "data.init_args.rot90": self.rot90,
            "data.init_args.crop_scale": list(self.crop_scale),
            "data.init_args.auto_augment": "trivialaugment" if self.trivial and self.fp.grayscale < 0.5 else "none",
            "data.init_args.random_erasing": self.erasing,
            "model.arch.patch_size": self.patch,
            "model.arch.stem": self.stem,
            "model.arch.embed_dim": w,
            "model.arch.depth": d,
            "model.arch.num_heads": h,
            "model.arch.drop_path_rate": self.drop_path,
            "model.lr": self.lr,
            "model.optimizer": self.optimizer,
            "model.arch.patch_drop_rate": self.patch_drop,
            "model.patch_drop_until": PATCH_DROP_UNTIL if self.patch_drop else 1.0,
            "model.weight_decay": WEIGHT_DECAY,
            "model.warmup_epochs": self.warmup,
            "model.label_smoothing": LABEL_SMOOTHING,
            "model.mixup_alpha": 0.8 if self.mixup else 0.0,
            "model.cutmix_alpha": 1.0 if self.mixup else 0.0,
            "trainer.max_epochs": self.epochs,
            "trainer.precision": self.precision,
            "attention_maps.every_n_epochs": max(1, self.epochs // MAP_LOGS),
            "attention_maps.faithfulness_images": self.map_images(),
        }
        if self.fp.task == "multilabel":  # no accuracy and no softmax prior: the ranking of each label's scores
            overrides["checkpoint.monitor"] = "val/mAP"
        elif self.fp.balance < LONG_TAIL_BALANCE:
            overrides["model.posthoc_logit_adjust"] = True
            overrides["checkpoint.monitor"] = "val/acc_balanced"
        return overrides

    def map_images(self) -> int:
        """Images for the maps' deletion measure: at most MAP_SHARE of the training time over the run's logs, where
        one image costs 66 forward passes, 22 training images' time (fewer than 8 measure nothing: none)."""
        logs = self.epochs // max(1, self.epochs // MAP_LOGS)
        images = int(MAP_SHARE * self.epochs * self.fp.n_train / (logs * 66 * FORWARD_SHARE))
        return min(MAP_IMAGES, images) if images >= 8 else 0

    def rows(self, overrides: dict[str, Any]) -> list[tuple[str, str, str]]:
        """The plan table: each decision, its value and why."""
        fp, (w, d, h), opt = self.fp, self.models[self.choice], OPTIMIZER_NAMES[self.optimizer]
        speed_text = ", ".join(f"{a.embed_dim}x{a.depth}: {s:.0f}" for a, s in zip(self.archs, self.speeds))
        flip, turns = "on" if self.hflip else "off", "on" if self.rot90 else "off"
        augmentation = (
            f"crop {self.crop_scale[0]:g}-1, flip {flip}, turns {turns}, {overrides['data.init_args.auto_augment']}"
            + (f", erasing {self.erasing:g}" if self.erasing else "")
            + (", mixup/cutmix" if self.mixup else "")
        )
        gray = "grayscale" if fp.grayscale >= 0.5 else "colour"
        bf16 = f"bf16 {self.bf16:.0f} img/s" if self.bf16 is not None else "bf16 not timed"
        measured = f"{w}x{d}: fp32 {self.fp32_speed:.0f} img/s, {bf16}; {self.why_precision}"
        tokens = math.prod(patch_grid(self.img_size, self.patch))
        rows = [
            (
                "data",
                f"{fp.n_train} train / {fp.n_val} val, {fp.num_classes} classes",
                f"class balance {fp.balance:.2f}",
            ),
            ("image sides", f"median {fp.median_side} px", f"{fp.min_side}-{fp.max_side} px, {gray}"),
            (
                "symmetry",
                f"mirror {fp.mirror_symmetry:.2f}, quarter turn {fp.turn_symmetry:.2f}",
                f"flips when >= {FLIP_SYMMETRY}, turns when >= {TURN_SYMMETRY}",
            ),
            ("machine", str(self.machine), f"decode ~{fp.decode_s:.0f} s"),
            ("speed (img/s)", speed_text, f"training steps at batch {self.timing_batch()}, fp32, {opt}"),
            ("precision", self.precision, measured),
            ("img_size, patch", f"{self.img_size}, {self.patch}", f"{tokens} tokens: {self.why_grid}"),
            ("model", f"{w} wide, {d} blocks, {h} heads", self.why_model),
            ("epochs", str(self.epochs), self.why_epochs + f"; ~{self.epoch_s:.1f} s each"),
            ("batch, lr, warmup", f"{self.batch}, {self.lr:.3g}, {self.warmup} ep", f"{opt}, cosine to 1%"),
            ("augmentation", augmentation, f"for {fp.n_train} images"),
            ("regularisation", f"label smoothing {LABEL_SMOOTHING}, drop path {self.drop_path}, wd {WEIGHT_DECAY}", ""),
        ]
        if fp.task == "multilabel":
            rows.append(
                (
                    "labels",
                    "several an image: a sigmoid each, best checkpoint by val/mAP, a threshold per label chosen on val",
                    f"label balance {fp.balance:.2f} (images per label)",
                )
            )
        elif fp.balance < LONG_TAIL_BALANCE:
            rule = "best checkpoint by val/acc_balanced, then post-hoc logit adjustment (tau from val, if beyond noise)"
            rows.append(("long tail", rule, f"class balance {fp.balance:.2f} < {LONG_TAIL_BALANCE} (docs/recipes.md)"))
        if self.patch_drop:
            share = f"{self.patch_drop:g} of the tokens, first {PATCH_DROP_UNTIL:g} of the epochs"
            rows.append(
                ("patch dropout", share, "faster early epochs, so more of them (epochs and estimate count full tokens)")
            )
        budget, minutes = self.budget_s, f" (~{self.estimate / 60:.0f} min on this machine)"
        rows.append(
            (
                "estimate",
                f"{self.estimate:.0f} s wall" + ("" if budget else minutes),
                "start to exit" + (f", budget {budget:.0f} s" if budget else ""),
            )
        )
        if self.photo:  # the digits' numbers of the same tier would say nothing about photos
            rows.append(("measured", f"held-out accuracy on 2 CPU cores, {MEASURED_PHOTOS}", "docs/recipes.md"))
        elif self.max_n in MEASURED:
            rows.append(("measured", f"best val/acc on 2 CPU cores, {MEASURED[self.max_n]}", "docs/recipes.md"))
        else:
            rows.append(("measured", "this tier: not measured (no set of this size here)", "docs/recipes.md"))
        if self.machine.device == "cuda":  # every rule was measured on 2 CPU cores; a GPU's side of them is as written
            rows.append(("on a GPU", "rules as written, not measured on one (batch 256 from 30,000 images)", ""))
        return rows
