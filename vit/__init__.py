"""A Vision Transformer toolkit: train, inspect and use ViT image classifiers.

    model/       the plain-torch ViT (ViTConfig, VisionTransformer), layers, variants, timm interop, checkpoint loading
    data/        sources, image files, one DataModule per source, the in-memory and streaming paths, augmentation
    training/    the LightningModule, optimizers, schedules, EMA, metrics, checkpoint writing
    evaluation/  attention maps, faithfulness, the report, calibration, logit adjustment, TTA, label issues
    planning/    fingerprint -> rules -> plan, speed calibration, the budgeted run
    deployment/  predict, serve, export
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


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED_MODULES else None

    def create_module(self, spec):
        return importlib.import_module(MOVED_MODULES[spec.name])

    def exec_module(self, module):
        pass  # already executed under its new name


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())
