"""The planner's rule table: each rule, then the measurement behind it (docs/recipes.md has the sweeps), and the small
functions that read it. vit/planning/plan.py applies them to a dataset's fingerprint and this machine's speed.
"""

from __future__ import annotations

import math

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
