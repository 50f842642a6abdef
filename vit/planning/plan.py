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
from vit.planning.rules import (
    EPOCH_OVERHEAD,
    FIXED_S,
    FLIP_SYMMETRY,
    FORWARD_SHARE,
    LABEL_SMOOTHING,
    LONG_TAIL_BALANCE,
    LR,
    MAP_IMAGES,
    MAP_LOGS,
    MAP_SHARE,
    MEASURED,
    MEASURED_PHOTOS,
    MODELS,
    OPTIMIZER_NAMES,
    PATCH_DROP_UNTIL,
    PHOTO_EPOCH_CAP,
    PHOTO_GRID,
    PHOTO_LR,
    PHOTO_SIDE,
    TURN_SYMMETRY,
    WEIGHT_DECAY,
    resolution,
    tier,
    token_grids,
    warmup_epochs,
)
from vit.planning.speed import Machine, calibrate

TABLE_VALUE_WIDTH = 60  # the plan table's value column at most; with the other two it fits a 120-column terminal
# The config keys behind a row of the table: where you set one of them, the row shows your value after the plan's.
ROW_KEYS = {
    "img_size, patch": ("data.init_args.img_size", "model.arch.patch_size"),
    "model": ("model.arch.embed_dim", "model.arch.depth", "model.arch.num_heads"),
    "epochs": ("trainer.max_epochs",),
    "batch, lr, warmup": ("data.init_args.batch_size", "model.lr", "model.warmup_epochs"),
    "precision": ("trainer.precision",),
}


@dataclass
class Plan:
    overrides: dict[str, Any]  # dotted config key -> value
    rows: list[tuple[str, str, str]] = field(default_factory=list)  # (what, value, why)
    estimate_s: float = 0.0  # planned wall time from process start to exit
    epoch_s: float = 0.0  # planned seconds per epoch (training + validation)
    cap: int = 0  # most epochs the budget may stretch the run to
    after_fit_s: float = 0.0  # planned seconds of the passes after fit (calibration, unknown statistics, test)

    def table(self) -> str:
        """The rows as three columns. The value column is as wide as the values up to TABLE_VALUE_WIDTH: a longer value
        (a row of measured figures) runs into its reason instead of pushing every row's reason off a terminal."""
        w = max(len(r[0]) for r in self.rows)
        v = max((len(r[1]) for r in self.rows if len(r[1]) <= TABLE_VALUE_WIDTH), default=0)
        return "\n".join(f"  {a:<{w}}  {b:<{v}}  {c}".rstrip() for a, b, c in self.rows)

    def mark_yours(self, yours: dict[str, Any], follows: dict[str, Any] | None = None) -> None:
        """Your values of planned keys (dotted key -> value), which the run trains with, and the planned values that
        follow them (`follows`: the warmup of your epochs): each row they replace shows them after the plan's value
        (its reason kept as the plan's), and a last row lists yours."""
        if not yours:
            return
        changed = {**(follows or {}), **yours}
        for i, (what, value, why) in enumerate(self.rows):
            mine = [_setting(key, changed[key]) for key in ROW_KEYS.get(what, ()) if key in changed]
            if mine:
                self.rows[i] = (what, f"{value} -> yours: {', '.join(mine)}", f"the plan's: {why}")
        listed = ", ".join(f"{key}={value}" for key, value in yours.items())
        self.rows.append(("yours (wins)", listed, "set in a config or on the command line"))


def _setting(key: str, value: Any) -> str:
    """`patch_size=4` for model.arch.patch_size; a float as %g."""
    name = key.rsplit(".", 1)[1]
    return f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}"


# ---------------------------------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------------------------------


def make_plan(
    fp: Fingerprint,
    machine: Machine,
    budget_s: float | None = None,
    elapsed_s: float = 0.0,
    speed_fn=None,
    *,
    precision: str | None = None,
) -> Plan:
    """The recipe for `fp` on `machine`. With `budget_s` (wall seconds from process start to exit, of which
    `elapsed_s` are spent), the largest allowed model that still trains MIN epochs, and as many epochs as fit (at most
    the tier's wanted epochs x 2); without, the tier's model and epochs. `speed_fn(archs, batch)` -> images/s
    (default: `calibrate` on this machine; tests pass a fake). `precision`: one you set, planned at (else chosen)."""
    return Planner(fp, machine, budget_s, elapsed_s, speed_fn, precision=precision).plan()


class Planner:
    """make_plan's steps, in the order they run: the tier's recipe, the token grid, the model and epochs that fit,
    the precision, then the overrides and the table that says why. Timed calibration adds to `elapsed_s`."""

    def __init__(
        self,
        fp: Fingerprint,
        machine: Machine,
        budget_s: float | None,
        elapsed_s: float,
        speed_fn=None,
        *,
        precision=None,
    ):
        self.fp, self.machine, self.budget_s, self.elapsed_s = fp, machine, budget_s, elapsed_s
        self.yours_precision = precision  # a precision you set: the run trains at it, so the plan times it
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
        self.after_fit = 0.0  # seconds planned for the passes after fit (a hybrid plans its CNN's)
        self.most = (PHOTO_EPOCH_CAP if self.photo else 2) * self.want  # the most epochs a budget may buy

    def plan(self) -> Plan:
        self.choose_grid()
        self.choose_model_and_epochs()
        self.choose_precision()
        self.choose_regularisation()
        overrides = self.overrides()
        rows = self.rows(overrides)
        return Plan(
            overrides=overrides,
            rows=rows,
            estimate_s=self.estimate,
            epoch_s=self.epoch_s,
            cap=self.most,
            after_fit_s=self.after_fit,
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
        yours = self.yours_precision
        if yours is not None:  # yours: timed in bf16 only where you train in it
            self.bf16 = self.timed([arch], "bf16-mixed")[0] if "bf16" in yours else None
            self.precision, self.why_precision = yours, "yours (set in a config or on the command line)"
        else:
            if self.machine.device == "cuda" or self.machine.native_bf16 is not False:
                self.bf16 = self.timed([arch], "bf16-mixed")[0]
            self.precision, self.why_precision = decide_precision(
                self.machine.device, lambda: (self.fp32_speed, self.bf16), native=lambda: self.machine.native_bf16
            )
        if "bf16" in self.precision and self.bf16 is not None:
            self.speeds = [*self.speeds[: self.choice], self.bf16, *self.speeds[self.choice + 1 :]]
            if self.spare is not None:
                self.epochs = int(max(1, min(self.most, self.spare // self.epoch_seconds(self.bf16))))
        self.epoch_s = self.epoch_seconds(self.speeds[self.choice])
        self.estimate = self.elapsed_s + self.fp.decode_s + FIXED_S + self.epochs * self.epoch_s

    def choose_regularisation(self) -> None:
        """Drop path by depth and warmup by the epochs, once both are decided (overrides and rows read them)."""
        depth = self.models[self.choice][1]
        self.drop_path = 0.05 if depth <= 4 else 0.1
        self.warmup = warmup_epochs(self.epochs)

    def overrides(self) -> dict[str, Any]:
        w, d, h = self.models[self.choice]
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

    def route_rows(self) -> list[tuple[str, str, str]]:
        """The rows of a start from weights (a fine-tune's, a hybrid's): none from scratch."""
        return []

    def measured(self) -> str:
        """What this kind of plan reached where it was measured, for the table's last row."""
        if self.photo:  # the digits' numbers of the same tier would say nothing about photos
            return f"held-out accuracy on 2 CPU cores, {MEASURED_PHOTOS}"
        if self.max_n in MEASURED:
            return f"best val/acc on 2 CPU cores, {MEASURED[self.max_n]}"
        return "this tier: not measured (no set of this size here)"

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
        rows += self.route_rows()
        budget, minutes = self.budget_s, f" (~{self.estimate / 60:.0f} min on this machine)"
        rows.append(
            (
                "estimate",
                f"{self.estimate:.0f} s wall" + ("" if budget else minutes),
                "start to exit" + (f", budget {budget:.0f} s" if budget else ""),
            )
        )
        rows.append(("measured", self.measured(), "docs/recipes.md"))
        if self.machine.device == "cuda":  # every rule was measured on 2 CPU cores; a GPU's side of them is as written
            rows.append(("on a GPU", "rules as written, not measured on one (batch 256 from 30,000 images)", ""))
        return rows
