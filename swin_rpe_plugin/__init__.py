"""Swin Transformer with 2D relative position bias, as an OpenMMLab backbone plugin."""
from .version import __version__
from .registry import MODELS
from .models import SwinTransformer  # noqa: E402  (registers the backbone)

__all__ = ['__version__', 'MODELS', 'SwinTransformer']
