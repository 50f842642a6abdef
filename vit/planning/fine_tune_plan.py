"""A planned fine-tune: `vit-train fit --data.root PATH --model.init_from WEIGHTS --budget 15min`.

The model is the weights' (vit/run/weights.py has put it into the config); what is left to plan is what a
fine-tune needs instead of a from-scratch run: the resolution (the weights' own, or fewer tokens when the budget
cannot give that one FT_MIN_EPOCHS), the learning rate and layer decay by the weights' width, and the epochs that
fit (head-only epochs measured no better: FT_HEAD_ONLY is 0).
The data's rules stay the from-scratch plan's (vit/planning/plan.py): flips and turns by the fingerprint, the tier's
crops, batch and long-tail rule. The measurements behind the numbers are in docs/recipes.md, "Planned fine-tune".
"""

from __future__ import annotations

import math

from vit.model.config import ViTConfig
from vit.model.patch_embed import patch_grid
from vit.planning.fingerprint import Fingerprint
from vit.planning.plan import Plan, Planner
from vit.planning.rules import CALIBRATION_BATCH
from vit.planning.speed import Machine

# The learning rate, by the weights' width:
# - ViT-S and wider (LITERATURE_WIDTH): MAE's and BEiT's fine-tuning rule, lr = 5e-4 x batch / 256 with AdamW and
#   layer decay FT_LAYER_DECAY, the top of their 0.65-0.75 (block i of L gets FT_LAYER_DECAY ** (L + 1 - i): early
#   features move least), 5 warmup epochs, drop path 0.1. Not measurable here: no such weights offline.
# - narrower weights (what this toolkit trains on a CPU): the from-scratch plan's lr, no layer decay. Measured on 1,000
#   clothing photos of 5 classes from weights trained on the other 5 (docs/recipes.md, "Planned fine-tune", 3 seeds,
#   held out): 94.0-94.6% against MAE's rule's 87.6-89.3% and 93.2-93.7% from scratch in the same budget; lr 5e-4
#   93.4%, layer decay 0.75 at the plan's lr 94.0% (seed 0, against 94.6%). On the solar cells from clothing weights
#   (a source that carries nothing there) every fine-tune stayed below from scratch: this rule 72.8 / 74.0% (accuracy
#   / balanced), MAE's 76.8 / 72.2%, from scratch 78.1 / 75.4% (3 folds).
LITERATURE_WIDTH = 384
FT_LR_PER_256 = 5e-4
FT_LAYER_DECAY = 0.75
# Epochs: a fine-tune is short (MAE: 50-100 on ImageNet); the budget buys at most FT_EPOCHS and a resolution is kept
# only where it buys FT_MIN_EPOCHS.
FT_EPOCHS = 60
FT_MIN_EPOCHS = 10
# Head-only epochs first (LP-FT, Kumar et al. 2022: a random new head's gradients distort the features before it
# has learned anything), as a share of the epochs: 6 of 60 measured 88.1% against 89.3% on the clothing pair (seed 0,
# MAE's rule) and 76.1 / 67.5% against 76.9 / 68.8% on the cells (fold 0): none.
FT_HEAD_ONLY = 0.0
# Calibration steps of a large model cost a CPU much of a budget (a ViT-B step at 224 px and batch 64 takes tens of
# seconds on 2 cores): above LARGE block parameters (~12 x depth x width^2; ViT-S: 21M) time a batch of
# CALIBRATION_BATCH instead; FitBudget corrects the epoch time from real epochs. Small models are timed at the plan's
# batch, as from scratch: a small batch times them slower per image and can flip the bf16 decision.
LARGE = 5e6
MEASURED_FINE_TUNE = "not measured on real pretrained weights here (no network for them); see docs/recipes.md"
MEASURED_SMALL = "held-out, 2 CPU cores, 3 min: 94.0-94.6% (1,000 clothing photos; weights from 5 other classes)"


class FineTunePlanner(Planner):
    """Planner's steps with the weights' model (`arch`: every ViTConfig field, as the config holds them after
    vit/run/weights.py) in place of the candidate models."""

    def __init__(
        self,
        fp: Fingerprint,
        machine: Machine,
        budget_s,
        elapsed_s,
        speed_fn=None,
        *,
        arch: dict,
        source,
        precision=None,
    ):
        super().__init__(fp, machine, budget_s, elapsed_s, speed_fn, precision=precision)
        self.arch, self.source = dict(arch), source
        self.models, self.max_model = [(arch["embed_dim"], arch["depth"], arch["num_heads"])], 0
        self.stem = arch.get("stem", "patch")
        self.optimizer = "adamw"  # timm's weights (and ours by default) were trained with it; so were the rules
        self.literature = arch["embed_dim"] >= LITERATURE_WIDTH
        if self.literature:
            self.lr, self.layer_decay = FT_LR_PER_256 * self.batch / 256, FT_LAYER_DECAY
        else:
            self.layer_decay = None  # self.lr: the from-scratch plan's (Planner.__init__)
        self.want, self.most, self.min_epochs = FT_EPOCHS, FT_EPOCHS, FT_MIN_EPOCHS

    def candidates(self, img_size: int, patch: int) -> list[ViTConfig]:
        fields = {**self.arch, "img_size": img_size, "patch_size": patch}
        return [ViTConfig(**{**fields, "in_chans": self.fp.in_chans, "num_classes": self.fp.num_classes})]

    def timing_batch(self) -> int:
        large = 12 * self.arch["depth"] * self.arch["embed_dim"] ** 2 > LARGE
        return min(self.batch, CALIBRATION_BATCH) if large else self.batch

    def sides(self) -> list[int]:
        """The weights' own side, then 3/4 and 1/2 of its token grid (multiples of the patch, at least 2x2)."""
        patch, own = self.arch["patch_size"], self.arch["img_size"]
        grid = patch_grid(own, patch)[0]
        grids = sorted({g for g in (grid, math.ceil(grid * 3 / 4), grid // 2) if g >= 2}, reverse=True)
        return [g * patch for g in grids]

    def choose_grid(self) -> None:
        sides, self.patch = self.sides(), self.arch["patch_size"]
        self.img_size = sides[0]
        if self.budget_s is None:
            self.why_grid = "the weights' own resolution (no --budget)"
            return
        # Time the weights' own side; fewer tokens are estimated from it (a step's time grows at least with the
        # tokens) and timed once chosen, in choose_model_and_epochs.
        own_speed = self.timed(self.candidates(sides[0], self.patch))[0]
        for side in sides:
            speed = own_speed * (sides[0] / side) ** 2
            if self.spare_s() / self.epoch_seconds(speed) >= FT_MIN_EPOCHS:
                self.img_size = side
                break
        else:
            self.img_size = sides[-1]
        own = f"the weights' {sides[0]} px"
        self.why_grid = (
            own + f" give {FT_MIN_EPOCHS}+ epochs in the budget"
            if self.img_size == sides[0]
            else own + f" would give fewer than {FT_MIN_EPOCHS} epochs: fewer tokens"
        )

    def choose_model_and_epochs(self) -> None:
        super().choose_model_and_epochs()
        self.why_model = f"the weights' (init_from={self.source})"

    def choose_regularisation(self) -> None:
        super().choose_regularisation()
        self.head_only = round(FT_HEAD_ONLY * self.epochs)

    def overrides(self) -> dict:
        overrides = super().overrides()
        for key in ("patch_size", "stem", "embed_dim", "depth", "num_heads"):
            del overrides[f"model.arch.{key}"]  # the weights' (fine_tune.py), not the candidates'
        overrides["model.layer_decay"] = self.layer_decay
        overrides["model.freeze_backbone_epochs"] = self.head_only
        return overrides

    def route_rows(self) -> list[tuple[str, str, str]]:
        head = f", head only for {self.head_only} ep" if self.head_only else ""
        if self.literature:
            what = f"lr {self.lr:.3g} = {FT_LR_PER_256:g} x {self.batch}/256, layer decay {FT_LAYER_DECAY}{head}"
            why = f"weights >= {LITERATURE_WIDTH} wide: MAE/BEiT's fine-tuning rule"
        else:
            what = f"lr {self.lr:.3g} (the from-scratch plan's), no layer decay{head}"
            why = f"weights < {LITERATURE_WIDTH} wide: measured here"
        return [("fine-tune", what, why + f", at most {FT_EPOCHS} epochs (docs/recipes.md)")]

    def measured(self) -> str:
        return MEASURED_FINE_TUNE if self.literature else MEASURED_SMALL


def make_fine_tune_plan(
    fp, machine, budget_s=None, elapsed_s=0.0, speed_fn=None, *, arch: dict, source: str, precision=None
) -> Plan:
    """make_plan (vit/planning/plan.py) for a fine-tune of `arch` (the weights' model) from `source`."""
    return FineTunePlanner(
        fp, machine, budget_s, elapsed_s, speed_fn, arch=arch, source=source, precision=precision
    ).plan()
