"""The model in plain torch (no Lightning): its configuration, the Vision Transformer, its layers and variants, timm
interop, and loading a model from a checkpoint file as data.

    from vit.model import VisionTransformer, ViTConfig
"""

from vit.model.config import ViTConfig
from vit.model.vision_transformer import VisionTransformer

__all__ = ["VisionTransformer", "ViTConfig"]
