"""Fit a state dict's bias tables to the backbone's window on every ``load_state_dict``.

A ``load_state_dict`` pre-hook on :class:`SwinTransformer`, so that every path a state dict
takes reaches it: mmengine's ``load_from``/``load_checkpoint`` (hence mmdet's ``init_detector``
and mmseg's ``init_model``), torch's ``load_state_dict`` of a whole detector or segmentor, and
``init_cfg`` Pretrained. A table saved at another window is resized with the one resize function
of ``ops`` instead of failing a strict load or, in a non-strict one, being skipped with the table
left at its initial values.
"""
import logging
import math
from typing import Dict, List, Optional, Tuple

from mmengine.logging import print_log
from torch import Tensor, nn

from ..ops import resize_relative_position_bias_table, table_rows

BIAS_TABLE = 'relative_position_bias_table'


def square_window_of_rows(rows: int) -> Optional[Tuple[int, int]]:
    """The square window (M, M) whose table has ``rows`` = (2M-1)^2 rows, or None."""
    side = math.isqrt(rows)
    if side * side != rows or side % 2 == 0:
        return None
    return ((side + 1) // 2, (side + 1) // 2)


def resize_bias_tables_on_load(module: nn.Module, state_dict: dict, prefix: str,
                               *args) -> Dict[str, Tuple[tuple, tuple]]:
    """Resize, in ``state_dict``, every bias table of ``module`` saved at another window.

    Tables whose rows are not (2M-1)^2 (a rectangular source window cannot be read from a
    length), or whose head count differs, are left for the shape check to report. Logs one line
    per stage whose tables were resized, and a warning naming all-zero tables. Returns
    {key: (old shape, new shape)}.
    """
    resized: Dict[str, Tuple[tuple, tuple]] = {}
    groups: Dict[tuple, List[str]] = {}
    zero, tables = [], 0
    for name, child in module.named_modules():
        own = getattr(child, BIAS_TABLE, None)
        key = f'{prefix}{name}.{BIAS_TABLE}'
        table = state_dict.get(key)
        if not isinstance(own, Tensor) or not isinstance(table, Tensor) or table.dim() != 2:
            continue
        tables += 1
        if not table.any():
            zero.append(key)
        window = getattr(child, 'window_size', None)
        source = square_window_of_rows(table.shape[0])
        if (table.shape == own.shape or window is None or source is None
                or table.shape[1] != own.shape[1] or own.shape[0] != table_rows(window)):
            continue
        state_dict[key] = resize_relative_position_bias_table(table, source, window)
        resized[key] = (tuple(table.shape), tuple(own.shape))
        stage = name.split('.blocks.')[0]
        groups.setdefault((stage, source, tuple(window), tuple(table.shape),
                           tuple(own.shape)), []).append(key)
    for (stage, source, window, old, new), keys in groups.items():
        print_log(f'{prefix}{stage}: resized {len(keys)} {BIAS_TABLE}s from window '
                  f'{source[0]}x{source[1]} {old} to the model window {window[0]}x{window[1]} '
                  f'{new} (bicubic)', logger='current')
    if zero:  # blank RPE pictures and no position bias: say why once, at load time
        print_log(f'{prefix.rstrip(".") or "backbone"}: {len(zero)} of {tables} {BIAS_TABLE}s '
                  f'in the state dict are all zero (first: {zero[0]}): never initialised or '
                  'trained (mmdet and mmseg leave them at zero)', logger='current',
                  level=logging.WARNING)
    return resized
