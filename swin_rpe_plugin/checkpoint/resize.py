"""Resolution transfer: bias tables to another window, position embeddings to another grid.

At load time (a checkpoint's window/grid differs from the model's) and at run time
(:func:`set_window_size` on a live model). Bias tables go through the one resize function of
``ops.relative_position``.
"""
import math
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from ..ops import (log_spaced_relative_coords, relative_position_index, resize_absolute_pos_embed,
                   resize_relative_position_bias_table, to_window_tuple)
from ..ops.kept import new_generation

HW = Tuple[int, int]
BIAS_TABLE = 'relative_position_bias_table'
POS_EMBED = 'absolute_pos_embed'


def square_window_of_table(rows: int, key: str = 'table') -> HW:
    """The square window (M, M) whose table has ``rows`` = (2M-1)^2 rows."""
    side = math.isqrt(rows)
    if side * side != rows or side % 2 == 0:
        raise ValueError(f'{key}: a table with {rows} rows is not (2M-1)^2 for a square window; '
                         'pass the checkpoint window explicitly (src_window=(h, w))')
    return ((side + 1) // 2, (side + 1) // 2)


def square_grid(tokens: int, key: str = POS_EMBED) -> HW:
    side = math.isqrt(tokens)
    if side * side != tokens:
        raise ValueError(f'{key}: {tokens} tokens are not a square grid; pass the checkpoint '
                         'grid explicitly (src_grid=(h, w))')
    return (side, side)


# Absolute position embeddings: a torch-only function that belongs in ops/ (kept here for now).
def resize_state_dict(state: Dict[str, Tensor], window=None, grid=None,
                      src_window=None, src_grid=None, mode: str = 'bicubic'
                      ) -> Tuple[Dict[str, Tensor], Dict[str, Tuple[tuple, tuple]]]:
    """Resize every bias table to ``window`` and the position embedding to ``grid``.

    ``window``/``grid`` may be a value or a function of the key (the model's per-module value);
    None leaves that kind of tensor alone. ``src_window``/``src_grid`` describe the checkpoint
    (default: inferred as square from the tensor's length). Returns (new state, resized keys
    with (old shape, new shape)).
    """
    out, resized = dict(state), {}
    for key, value in state.items():
        leaf = key.rsplit('.', 1)[-1]
        if leaf == BIAS_TABLE and window is not None:
            new = to_window_tuple(window(key) if callable(window) else window)
            old = (to_window_tuple(src_window, 'src_window') if src_window is not None
                   else square_window_of_table(value.shape[0], key)
                   if value.shape[0] != (2 * new[0] - 1) * (2 * new[1] - 1) else new)
            if old != new:
                out[key] = resize_relative_position_bias_table(value, old, new, mode)
        elif key == POS_EMBED and grid is not None:
            new = to_window_tuple(grid(key) if callable(grid) else grid, 'grid')
            tokens = value.shape[1] * (value.shape[2] if value.dim() == 4 else 1)
            old = (to_window_tuple(src_grid, 'src_grid') if src_grid is not None
                   else tuple(value.shape[1:3]) if value.dim() == 4
                   else new if tokens == new[0] * new[1] else square_grid(tokens, key))
            if old != new or value.dim() == 4:
                out[key] = resize_absolute_pos_embed(value, old, new, mode)
        if out[key] is not value and out[key].shape != value.shape:
            resized[key] = (tuple(value.shape), tuple(out[key].shape))
    return out, resized


@torch.no_grad()
def set_window_size(model: nn.Module, window_size, mode: str = 'bicubic') -> Dict[str, Tuple]:
    """Change the window of a live SwinTransformer in place, resizing every bias table.

    Each WindowMSA gets a resized table (a new Parameter: build the optimizer afterwards) and
    a rebuilt ``relative_position_index``; shifted blocks shift by (h // 2, w // 2). A SwinV2
    backbone resizes nothing: its coordinates are rebuilt for the new window, still normalised
    by the window its weights were trained with (``pretrained_window_size``).
    Returns {table name: (old shape, new shape)} (empty for SwinV2).
    """
    from ..models.layers import WindowMSA  # checkpoint sits above models
    new = to_window_tuple(window_size)
    stages = getattr(model, 'stages', None)
    if stages is None:
        raise TypeError(f'model must be a swin_rpe_plugin SwinTransformer, got '
                        f'{type(model).__name__}')
    resized = {}
    for s, stage in enumerate(stages):
        stage.window_size = new
        for b, block in enumerate(stage.blocks):
            shift = (new[0] // 2, new[1] // 2) if b % 2 == 1 else (0, 0)
            block.shift_size = block.attn.shift_size = shift
            block.attn.window_size = new
            msa: WindowMSA = block.attn.w_msa
            if hasattr(msa, 'cpb_mlp'):  # SwinV2: continuous position bias
                device = msa.relative_position_index.device
                msa.relative_position_index = relative_position_index(new, device=device)
                msa.relative_coords_table = log_spaced_relative_coords(
                    new, msa.pretrained_window_size, device=device)
                msa.window_size = new
                continue
            old_table = msa.relative_position_bias_table
            table = resize_relative_position_bias_table(old_table.detach(), msa.window_size,
                                                        new, mode)
            msa.relative_position_bias_table = nn.Parameter(
                table, requires_grad=old_table.requires_grad)
            msa.relative_position_index = relative_position_index(
                new, device=msa.relative_position_index.device)
            if msa.window_size != new:
                resized[f'stages.{s}.blocks.{b}.attn.w_msa.{BIAS_TABLE}'] = (
                    tuple(old_table.shape), tuple(table.shape))
            msa.window_size = new
    model.window_size = new
    new_generation()  # no bias kept for the old window is served (ops/kept.py)
    return resized
