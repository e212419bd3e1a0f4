"""Swin Transformer with 2D relative position bias, as an OpenMMLab backbone plugin."""
from .version import __version__
from .compat import check_torch

check_torch()  # one line naming the floor on an older torch, before anything else fails
from .registry import HOOKS, MODELS, OPTIM_WRAPPERS  # noqa: E402
from .models import (PaddingAwareHook, SwinTransformer,  # noqa: E402  (registers them)
                     SwinTransformerV2, enable_padding_aware)
from .optim import AutocastOptimWrapper  # noqa: E402  (registers it)
from .checkpoint import allow_mmengine_checkpoints

# mmengine Runner checkpoints (numpy values in meta, HistoryBuffer in message_hub) under
# torch >= 2.6's weights_only=True default: a data-only allow-list, so `load_from` and
# `--resume` work without turning checkpoint safety off (see checkpoint/compat.py).
allow_mmengine_checkpoints()

__all__ = ['__version__', 'AutocastOptimWrapper', 'HOOKS', 'MODELS', 'OPTIM_WRAPPERS',
           'PaddingAwareHook', 'SwinTransformer', 'SwinTransformerV2', 'enable_padding_aware']
