"""Checkpoints: safe reading, format detection and conversion, resolution transfer, reports."""
from .compat import allow_mmengine_checkpoints, mmengine_safe_globals
from .convert import convert_state_dict, detect_format, official_to_unfold, unwrap
from .formats import FORMATS, FORMATS_BY_NAME
from .loader import (LoadReport, UnsafeCheckpointError, convert_checkpoint, convert_file,
                     load_pretrained, read_checkpoint)
from .resize import resize_absolute_pos_embed, resize_state_dict, set_window_size

__all__ = [
    'FORMATS', 'FORMATS_BY_NAME', 'LoadReport', 'UnsafeCheckpointError',
    'allow_mmengine_checkpoints', 'convert_checkpoint', 'convert_file', 'convert_state_dict',
    'detect_format', 'load_pretrained', 'mmengine_safe_globals', 'official_to_unfold',
    'read_checkpoint', 'resize_absolute_pos_embed', 'resize_state_dict', 'set_window_size',
    'unwrap',
]
