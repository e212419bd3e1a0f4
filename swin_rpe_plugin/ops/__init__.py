"""The functional core: plain tensor functions, torch only, no module state."""
from .absolute_position import resize_absolute_pos_embed
from .attention import split_qkv, window_attention, window_attention_qkv
from .continuous_position import (continuous_position_bias, log_spaced_relative_coords,
                                  resolve_pretrained_window, scaled_cosine_query_key)
from .masks import (MASK_VALUE, padding_key_mask,
                    shift_attention_mask, shift_region_labels, window_attention_mask)
from .plan import WindowPlan, cached_window_plan, traceable_window_plan, window_plan
from .linear import fuses_residual, linear, linear_residual, onednn_available
from .recompute import linear_keeping_input, linear_with_recomputed_input
from .relative_position import (gather_relative_position_bias, relative_position_index,
                                resize_relative_position_bias_table,
                                table_rows, to_window_tuple)
from .windows import gather_tokens, pad_to_window, padded_size, window_partition

__all__ = [
    'MASK_VALUE', 'WindowPlan', 'cached_window_plan', 'continuous_position_bias',
    'gather_relative_position_bias', 'log_spaced_relative_coords', 'resolve_pretrained_window',
    'scaled_cosine_query_key',
    'fuses_residual', 'gather_tokens', 'linear', 'linear_residual',
    'linear_keeping_input', 'linear_with_recomputed_input', 'onednn_available',
    'window_plan',
    'pad_to_window', 'padded_size', 'padding_key_mask', 'relative_position_index',
    'resize_absolute_pos_embed', 'resize_relative_position_bias_table',
    'shift_attention_mask', 'shift_region_labels', 'split_qkv', 'table_rows', 'to_window_tuple',
    'traceable_window_plan',
    'window_attention', 'window_attention_qkv', 'window_attention_mask', 'window_partition',
]
