"""The training recipe: every field of the `model:` section besides `arch`, declared once with its type, default,
meaning and check. `ViTClassifier(arch=..., **recipe)` takes them flat (the YAML keys and `--model.<field>` flags stay
flat: jsonargparse follows `**recipe` to this class), and keeps them typed as `module.recipe`.

    recipe = TrainingRecipe(lr=5e-4, ema_decay=0.999)   # a bad value: one ValueError naming the field and the value
    recipe.check_with(arch)                              # the checks that need the architecture
    recipe.to_dict()                                     # plain types: the checkpoint's hyper-parameters
"""

from dataclasses import asdict, dataclass, fields
from typing import Literal

from vit.model.config import HYBRID_STEMS, ViTConfig
from vit.training.teacher import check_teacher_name

# Fields that must be >= 0, and shares that must lie in [0, 1]
NUMBERS = (
    "lr",
    "weight_decay",
    "warmup_epochs",
    "mixup_alpha",
    "cutmix_alpha",
    "moe_aux_weight",
    "logit_adjust_tau",
    "drloc_weight",
    "guidance_weight",
    "freeze_backbone_epochs",
    "freeze_stem_epochs",
)
SHARES = (
    "label_smoothing",
    "mixup_prob",
    "min_lr_ratio",
    "resize_until",
    "patch_drop_until",
    "teacher_share",
    "distill_weight",
)


@dataclass
class TrainingRecipe:
    """How a ViT trains: optimizer, schedule, losses, starting weights and what is saved for predict.

    Args:
        moe_aux_weight: with `arch.moe_experts`, the weight of the load-balancing loss in the training loss (logged as
            train/moe_aux_loss); each epoch's expert usage goes to TensorBoard as histograms moe/expert_usage/layer_i.
        lr: peak learning rate of AdamW, reached after `warmup_epochs` of linear warmup, then cosine to
            `lr * min_lr_ratio`, stepped every batch.
        weight_decay: AdamW decay, not applied to norms, biases, position embeddings and the class token.
        betas: AdamW's (beta1, beta2).
        warmup_epochs: linear warmup from 0 to `lr`, in epochs (a fraction is fine).
        min_lr_ratio: where the schedule ends, as a share of `lr`.
        label_smoothing: of the cross-entropy's targets.
        mixup_alpha: timm's Mixup on the batch (0 = off).
        cutmix_alpha: timm's CutMix on the batch (0 = off).
        mixup_prob: the share of batches mixed when Mixup or CutMix is on.
        compile: torch.compile the model (in place, before fit). Pays off on GPU; on a 2-core CPU a digits epoch
            ran 20% faster but compiling took 31 s (cold cache), more than make train's 60 epochs win back.
        init_from: weights to start from (vit/model/pretrained.py): a timm name found in the Hugging Face cache, a
            timm ViT weights file (.safetensors / .pth / .bin, timm's config.json beside it read when there) or a
            checkpoint of this toolkit. The head is new when the classes differ, the position embeddings are
            resampled to img_size, the first layer adapted to the channels. `arch` must match the weights
            (`vit-train fit` fills it from them). Saved checkpoints hold the weights, not this name.
        stem_from: ImageNet weights of a hybrid stem (`arch.stem` tf_efficientnet_lite*), for a new run only.
        layer_decay: layer-wise learning-rate decay (BEiT): block i of L gets lr * layer_decay ** (L + 1 - i).
        freeze_backbone_epochs: train only the head (and fc_norm) for this many epochs first.
        freeze_stem_epochs: a pretrained CNN stem (`arch.stem` tf_efficientnet_lite*) takes no gradient, and its
            BatchNorm statistics stay, for this many epochs first while the new blocks on it train (LP-FT's argument;
            the hybrid plan sets 1).
        skip_nonfinite: skip the optimizer update of a step whose loss or gradients are NaN or infinite (counted
            in train/skipped_nonfinite) instead of stopping with an error that names the step. Decided on the
            device, without a host sync per step (vit/training/nonfinite.py).
        ema_decay: keep an exponential moving average of the weights, updated every step with this decay (0: off;
            0.999 averages over ~1,000 steps), and use it for validation and in the saved checkpoints (what predict,
            export and serve load): Lightning's EMAWeightAveraging callback over vit/training/ema.py's DeviceEMA.
        optimizer: "adamw", or "muon": Muon for the blocks' 2D matrices and AdamW for the rest, at the same lr and
            weight decay (vit.training.optim.MuonWithAdamW).
        schedule: after warmup, "cosine" to `lr * min_lr_ratio`, or "wsd" (warmup-stable-decay): the peak lr until
            the last `WSD_DECAY` share of the steps, then linear down to `lr * min_lr_ratio`.
        resize_from: progressive resizing (0: off): train at this side first (a multiple of patch_size, below
            img_size), growing by one patch per phase up to img_size when `resize_until` of the epochs are done. The
            batch is resized on the device; the position embeddings are resampled to the smaller grid.
        resize_until: the share of the epochs after which progressive resizing trains at img_size.
        patch_drop_until: with `arch.patch_drop_rate`, the share of the epochs that drop patch tokens (then none).
        logit_adjust_tau: the logit-adjusted loss for long-tailed data (Menon et al., 2021): the training loss sees
            `logits + tau * log(prior)`, the prior being the training set's class shares, so that rare classes need a
            larger margin; predictions use the plain logits. 0: off.
        posthoc_logit_adjust: at the end of fit, choose tau on the validation set and fold `-tau * log(prior)` into
            the saved checkpoints' head bias (vit/evaluation/logit_adjustment.py; tau 0 where the gain is within the
            validation set's noise): balanced accuracy for a skewed prior. The planner sets it on long tails.
        class_names: linked from the DataModule by `train.py`; saved for predict.
        task: linked from the DataModule: "multiclass" (one label an image, softmax), or "multilabel" (several: a
            sigmoid per label, binary cross-entropy, val/mAP and F1; vit/training/multilabel.py).
        teacher: a timm CNN trained from scratch first, for `teacher_share` of the budget (ImageNet weights,
            vit/model/cnn_weights.py: fine-tuned), or a teacher.safetensors of an earlier run; then DeiT's hard
            distillation (`distill_weight`, vit/training/teacher.py), by the distillation token's head with
            `arch.dist_token`, else by the logits.
        teacher_share: the share of the budget the teacher trains for.
        teacher_img_size: the side the teacher sees (null: the student's).
        distill_weight: the distillation loss's share of the training loss.
        drloc_weight: DRLoc's auxiliary loss (the final tokens' relative positions, vit/training/drloc.py); 0: off.
        guidance_weight: with a teacher, locality guidance: every block imitates a teacher stage's features; 0: off.
        mean: the normalisation's per-channel mean, linked from the DataModule; saved for predict.
        std: the normalisation's per-channel std, linked from the DataModule; saved for predict.
    """

    moe_aux_weight: float = 0.01
    lr: float = 1e-3
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_epochs: float = 5.0
    min_lr_ratio: float = 0.01
    label_smoothing: float = 0.1
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    mixup_prob: float = 1.0
    compile: bool = False
    init_from: str | None = None
    stem_from: str | None = None
    layer_decay: float | None = None
    freeze_backbone_epochs: int = 0
    freeze_stem_epochs: int = 0
    skip_nonfinite: bool = False
    ema_decay: float = 0.0
    optimizer: Literal["adamw", "muon"] = "adamw"
    schedule: Literal["cosine", "wsd"] = "cosine"
    resize_from: int = 0
    resize_until: float = 0.5
    patch_drop_until: float = 1.0
    logit_adjust_tau: float = 0.0
    posthoc_logit_adjust: bool = False
    class_names: list[str] | None = None
    task: Literal["multiclass", "multilabel"] = "multiclass"
    teacher: str | None = None
    teacher_share: float = 0.3
    teacher_img_size: int | None = None
    distill_weight: float = 0.5
    drloc_weight: float = 0.0
    guidance_weight: float = 0.0
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)

    def __post_init__(self) -> None:
        # Plain types only (lists of floats, not tuples): the checkpoint must load with weights_only=True.
        self.class_names = list(self.class_names) if self.class_names else None
        self.mean, self.std = tuple(float(v) for v in self.mean), tuple(float(v) for v in self.std)
        self.betas = tuple(float(b) for b in self.betas)
        for name in NUMBERS:
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        for name in SHARES:
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}={getattr(self, name)} must be in [0, 1]")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay={self.ema_decay} must be in [0, 1)")
        if self.layer_decay is not None and not 0.0 < self.layer_decay <= 1.0:
            raise ValueError(f"layer_decay={self.layer_decay} must be in (0, 1]")
        if self.optimizer not in ("adamw", "muon"):
            raise ValueError(f"optimizer={self.optimizer!r} must be 'adamw' or 'muon'")
        if self.schedule not in ("cosine", "wsd"):
            raise ValueError(f"schedule={self.schedule!r} must be 'cosine' or 'wsd'")
        if self.teacher:
            if self.task != "multiclass":
                raise ValueError(
                    f"teacher={self.teacher!r}: distillation takes one label an image, not task={self.task!r}"
                )
            check_teacher_name(self.teacher)
        if self.guidance_weight and not self.teacher:
            raise ValueError(
                f"guidance_weight={self.guidance_weight} imitates a teacher's features: set --model.teacher"
            )

    def check_with(self, arch: ViTConfig) -> None:
        """The checks that need the architecture: one ValueError naming the field and the value."""
        if self.freeze_stem_epochs and arch.stem not in HYBRID_STEMS:
            raise ValueError(
                f"freeze_stem_epochs={self.freeze_stem_epochs} holds a pretrained CNN stem still, but "
                f"stem={arch.stem!r}: set --model.arch.stem to one of {', '.join(HYBRID_STEMS)} "
                "(or freeze_stem_epochs 0)"
            )
        if self.resize_from and (self.resize_from % arch.patch_size or not 0 < self.resize_from < arch.img_size):
            raise ValueError(
                f"resize_from={self.resize_from} must be a multiple of patch_size={arch.patch_size} below "
                f"img_size={arch.img_size} (or 0: off)"
            )
        if self.class_names is not None and len(self.class_names) != arch.num_classes:
            raise ValueError(f"class_names has {len(self.class_names)} names but num_classes={arch.num_classes}")
        if self.drloc_weight and arch.patch_drop_rate:
            raise ValueError(
                f"drloc_weight={self.drloc_weight} needs every token where it was: not with "
                f"patch_drop_rate={arch.patch_drop_rate}"
            )
        if arch.dist_token and not self.teacher:
            raise ValueError(
                "dist_token=true: the distillation token's head learns a teacher's class: set --model.teacher"
            )

    def to_dict(self) -> dict:
        """Plain types for the checkpoint's hyper-parameters (lists, not tuples)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


RECIPE_FIELDS = frozenset(f.name for f in fields(TrainingRecipe))
