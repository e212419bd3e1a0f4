from .padding import PaddingAwareHook, enable_padding_aware, valid_sizes_from_samples
from .swin import SwinTransformer

__all__ = ['PaddingAwareHook', 'SwinTransformer', 'enable_padding_aware',
           'valid_sizes_from_samples']
