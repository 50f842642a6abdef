"""A Vision Transformer toolkit: train, inspect and use ViT image classifiers."""

from vit.model import VisionTransformer

__all__ = ["VisionTransformer"]
