"""Data: sources and image files, one DataModule per source, the in-memory path (decoded once, batched and augmented
on the training device) and the streaming path (litdata chunks, per-image torchvision transforms).

The DataModules are importable from here, `vit.data.<Name>`, the class paths the configs and older plan.yaml files
name; looked up on first use, so that `vit.data.images` does not import every source.
"""

import importlib

HOMES = {
    "ImageClassificationData": "vit.data.base",
    "DigitsDataModule": "vit.data.digits",
    "CIFARDataModule": "vit.data.cifar",
    "ImageFolderDataModule": "vit.data.folder",
    "TorchvisionDataModule": "vit.data.torchvision_data",
    "StreamingDataModule": "vit.data.streaming",
}
__all__ = list(HOMES)


def __getattr__(name: str):
    if name in HOMES:
        return getattr(importlib.import_module(HOMES[name]), name)
    raise AttributeError(f"module 'vit.data' has no attribute {name!r}")
