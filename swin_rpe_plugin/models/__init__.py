from .padding import PaddingAwareHook, enable_padding_aware, valid_sizes_from_samples
from .swin import SwinTransformer
from .swin_v2 import SwinTransformerV2

__all__ = ['PaddingAwareHook', 'SwinTransformer', 'SwinTransformerV2', 'enable_padding_aware',
           'valid_sizes_from_samples']
