"""A Vision Transformer toolkit: train, inspect and use ViT image classifiers.

    model/       the plain-torch ViT (ViTConfig, VisionTransformer), layers, variants, timm interop, checkpoint loading
    data/        sources, image files, one DataModule per source, the in-memory and streaming paths, augmentation
    training/    the LightningModule, optimizers, schedules, EMA, metrics, checkpoint writing
    evaluation/  attention maps, faithfulness, the report, calibration, logit adjustment, TTA, label issues
    planning/    fingerprint -> start -> rules -> plan, speed calibration, the precision rule (pure functions)
    deployment/  predict, serve, export
    run/         what vit-train adds around Lightning's loop: weights and plan into the config, the budget, the estimate
    commands/    one module per command-line program
A package imports only from those listed above it (model and data import neither each other nor anything else).
"""

import importlib
import importlib.abc
import importlib.util
import sys

from vit.model import VisionTransformer

__all__ = ["VisionTransformer"]

# Modules that configs, plan.yaml files and checkpoints written before the split into subpackages name in their
# `class_path`s (vit.datasets.TorchvisionDataModule, ...): importing the old name gives the module that holds those
# classes now, so such files keep loading. vit.data.<Name> of the old vit/data.py is served by vit/data/__init__.py.
MOVED_MODULES = {"vit.datasets": "vit.data.torchvision_data", "vit.streaming": "vit.data.streaming"}
# Modules that user code imported before the split (`from vit.interop import from_timm`): they keep working, with a
# DeprecationWarning that names the new path.
RENAMED_MODULES = {
    f"vit.{old}": new
    for old, new in {
        "attention_maps": "vit.evaluation.attention_maps",
        "augment": "vit.data.augment",
        "calibration": "vit.evaluation.calibration",
        "checkpoint": "vit.model.checkpoint",
        "checkpoint_io": "vit.training.checkpoint_io",
        "crops": "vit.data.crops",
        "dataset_files": "vit.data.files",
        "device_data": "vit.data.device",
        "ema": "vit.training.ema",
        "export": "vit.deployment.export",
        "faithfulness": "vit.evaluation.faithfulness",
        "images": "vit.data.images",
        "interop": "vit.model.interop",
        "label_issues": "vit.evaluation.label_issues",
        "layers": "vit.model.layers",
        "logit_adjustment": "vit.evaluation.logit_adjustment",
        "metrics": "vit.training.metrics",
        "module": "vit.training.module",
        "moe": "vit.model.moe",
        "nonfinite": "vit.training.nonfinite",
        "optim": "vit.training.optim",
        "plan": "vit.planning.plan",
        "planned_run": "vit.run.planned",
        "predict": "vit.deployment.predict",
        "serve": "vit.deployment.serve",
        "sources": "vit.data.sources",
        "timed_checkpoint": "vit.training.timed_checkpoint",
        "tta": "vit.evaluation.tta",
    }.items()
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        moved = name in MOVED_MODULES or name in RENAMED_MODULES
        return importlib.util.spec_from_loader(name, self) if moved else None

    def create_module(self, spec):
        if spec.name in RENAMED_MODULES:
            import warnings

            new = RENAMED_MODULES[spec.name]
            warnings.warn(f"{spec.name} is now {new}: import it from there", DeprecationWarning, stacklevel=2)
            return importlib.import_module(new)
        return importlib.import_module(MOVED_MODULES[spec.name])

    def exec_module(self, module):
        pass  # already executed under its new name


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())
