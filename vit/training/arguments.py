"""The LightningModule's training arguments, checked when it is built: each bad value is one ValueError that names
the field and the value (the architecture's own fields are checked by ViTConfig)."""

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


def check_arguments(arch: ViTConfig, hp) -> None:
    """ViTClassifier's arguments (`hp`, its hyper-parameters: Lightning's AttributeDict), checked at construction: a
    one-line ValueError naming the field and the value."""
    for name in NUMBERS:
        if getattr(hp, name) < 0:
            raise ValueError(f"{name}={getattr(hp, name)} must be >= 0")
    for name in SHARES:
        if not 0.0 <= getattr(hp, name) <= 1.0:
            raise ValueError(f"{name}={getattr(hp, name)} must be in [0, 1]")
    ema_decay, layer_decay, freeze_backbone_epochs = hp.ema_decay, hp.layer_decay, hp.freeze_backbone_epochs
    freeze_stem_epochs, optimizer, schedule = hp.freeze_stem_epochs, hp.optimizer, hp.schedule
    resize_from, class_names, teacher, task = hp.resize_from, hp.class_names, hp.teacher, hp.task
    if not 0.0 <= ema_decay < 1.0:
        raise ValueError(f"ema_decay={ema_decay} must be in [0, 1)")
    if layer_decay is not None and not 0.0 < layer_decay <= 1.0:
        raise ValueError(f"layer_decay={layer_decay} must be in (0, 1]")
    if freeze_backbone_epochs < 0:
        raise ValueError(f"freeze_backbone_epochs={freeze_backbone_epochs} must be >= 0")
    if freeze_stem_epochs < 0:
        raise ValueError(f"freeze_stem_epochs={freeze_stem_epochs} must be >= 0")
    if freeze_stem_epochs and arch.stem not in HYBRID_STEMS:
        raise ValueError(
            f"freeze_stem_epochs={freeze_stem_epochs} holds a pretrained CNN stem still, but stem={arch.stem!r}: "
            f"set --model.arch.stem to one of {', '.join(HYBRID_STEMS)} (or freeze_stem_epochs 0)"
        )
    if optimizer not in ("adamw", "muon"):
        raise ValueError(f"optimizer={optimizer!r} must be 'adamw' or 'muon'")
    if schedule not in ("cosine", "wsd"):
        raise ValueError(f"schedule={schedule!r} must be 'cosine' or 'wsd'")
    if resize_from and (resize_from % arch.patch_size or not 0 < resize_from < arch.img_size):
        raise ValueError(
            f"resize_from={resize_from} must be a multiple of patch_size={arch.patch_size} below "
            f"img_size={arch.img_size} (or 0: off)"
        )
    if class_names is not None and len(class_names) != arch.num_classes:
        raise ValueError(f"class_names has {len(class_names)} names but num_classes={arch.num_classes}")
    if teacher:
        if task != "multiclass":
            raise ValueError(f"teacher={teacher!r}: distillation takes one label an image, not task={task!r}")
        check_teacher_name(teacher)
    if hp.drloc_weight and arch.patch_drop_rate:
        raise ValueError(
            f"drloc_weight={hp.drloc_weight} needs every token where it was: not with "
            f"patch_drop_rate={arch.patch_drop_rate}"
        )
    if arch.dist_token and not teacher:
        raise ValueError("dist_token=true: the distillation token's head learns a teacher's class: set --model.teacher")
    if hp.guidance_weight and not teacher:
        raise ValueError(f"guidance_weight={hp.guidance_weight} imitates a teacher's features: set --model.teacher")
