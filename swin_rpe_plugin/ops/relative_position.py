"""2D relative position bias: the compact table, its index and its gather.

A window of Mh x Mw tokens has (2Mh-1)(2Mw-1) distinct offsets (dy, dx) between a query and a
key. The bias of each offset is one row of a learned table; the index maps every (query, key)
pair of the window to its row. Row = (dy + Mh - 1) * (2Mw - 1) + (dx + Mw - 1), the layout of
the official Swin code and of every checkpoint derived from it.

Imports torch only.
"""
from typing import Tuple

import torch
from torch import Tensor

from ..compat import WeakIdKeyDictionary, is_compiling

__all__ = ['to_window_tuple', 'relative_position_index', 'gather_relative_position_bias',
           'resize_relative_position_bias_table',
           'table_rows']


def to_window_tuple(window_size, name: str = 'window_size') -> Tuple[int, int]:
    """Normalise an int or an (h, w) pair to a validated (h, w) tuple of positive ints."""
    if isinstance(window_size, bool):
        raise TypeError(f'{name} must be an int or a pair of ints, got {window_size!r}')
    if isinstance(window_size, int):
        window_size = (window_size, window_size)
    try:
        window = tuple(int(v) for v in window_size)
        valid = len(window) == 2 and all(int(v) == v for v in window_size)
    except (TypeError, ValueError):
        raise TypeError(f'{name} must be an int or a pair of ints, got {window_size!r}') from None
    if not valid:
        raise ValueError(f'{name} must be an int or a pair (h, w) of ints, got {window_size!r}')
    if min(window) < 1:
        raise ValueError(f'{name} must be >= 1 on each side, got {window_size!r}')
    return window


def table_rows(window_size) -> int:
    """Rows of the compact bias table for a window: (2Mh-1)(2Mw-1)."""
    mh, mw = to_window_tuple(window_size)
    return (2 * mh - 1) * (2 * mw - 1)


def relative_position_index(window_size, device=None) -> Tensor:
    """Index of the bias-table row of every (query, key) pair of a window.

    Args:
        window_size: M or (Mh, Mw).
        device: where to build the index.

    Returns:
        Long tensor [Mh*Mw, Mh*Mw] with values in [0, (2Mh-1)(2Mw-1)); tokens are flattened
        row-major (y * Mw + x).
    """
    mh, mw = to_window_tuple(window_size)
    ys, xs = torch.meshgrid(torch.arange(mh, device=device), torch.arange(mw, device=device),
                            indexing='ij')
    ys, xs = ys.flatten(), xs.flatten()
    dy = ys[:, None] - ys[None, :] + (mh - 1)  # [N, N], query minus key, shifted to >= 0
    dx = xs[:, None] - xs[None, :] + (mw - 1)
    return dy * (2 * mw - 1) + dx


def gather_relative_position_bias(table: Tensor, index: Tensor,
                                  contiguous: bool = True) -> Tensor:
    """Expand a compact bias table into the dense per-head bias of one window.

    Args:
        table: [(2Mh-1)(2Mw-1), heads].
        index: [N, N] from :func:`relative_position_index`.
        contiguous: False returns the gather's permuted view, no copy (the generic path: its
            shift mask's sum makes a new tensor, and a GPU's SDPA copies an unaligned mask
            into aligned rows itself).

    Returns:
        [heads, N, N]: entry (h, i, j) is the bias head h adds to query i attending key j.
    """
    if table.dim() != 2:
        raise ValueError(f'table must be 2-D [rows, heads], got shape {tuple(table.shape)}')
    # On the CPU only (elsewhere reading the max is a host sync, impossible on meta, and an
    # index past the table fails in the gather below anyway), once per index and version.
    if (index.device.type == 'cpu' and not is_compiling() and not torch.jit.is_tracing()
            and index.numel() and _index_rows(index) > table.shape[0]):
        raise ValueError(f'index refers to row {_index_rows(index) - 1} but table has '
                         f'{table.shape[0]} rows: window and table do not match')
    n = index.shape[0]
    bias = table[index.reshape(-1)].reshape(n, n, -1).permute(2, 0, 1)
    return bias.contiguous() if contiguous else bias


def _index_rows(index: Tensor) -> int:
    """1 + the largest row an index refers to, read once per index tensor and version."""
    version = None if index.is_inference() else index._version
    cached = _INDEX_ROWS.get(index)
    if cached is None or version is None or cached[0] != version:
        cached = (version, int(index.max()) + 1)
        if version is not None:
            _INDEX_ROWS[index] = cached
    return cached[1]


_INDEX_ROWS = WeakIdKeyDictionary()  # index -> (its version, 1 + its largest row)


def resize_relative_position_bias_table(table: Tensor, old_window, new_window,
                                        mode: str = 'bicubic') -> Tensor:
    """Resample a bias table from one window size to another on its offset grid.

    The table is viewed as a (2Mh-1) x (2Mw-1) image per head and interpolated to the new grid
    (rectangular windows allowed). Serves checkpoint loading and a live window change alike.

    Args:
        table: [(2Mh-1)(2Mw-1), heads] for old_window.
        old_window, new_window: M or (Mh, Mw).
        mode: 'bicubic' or 'bilinear'.

    Returns:
        [(2Mh'-1)(2Mw'-1), heads], a new tensor with table's dtype.
    """
    if mode not in ('bicubic', 'bilinear'):
        raise ValueError(f"mode must be 'bicubic' or 'bilinear', got {mode!r}")
    old_h, old_w = to_window_tuple(old_window, 'old_window')
    new_h, new_w = to_window_tuple(new_window, 'new_window')
    if table.dim() != 2 or table.shape[0] != (2 * old_h - 1) * (2 * old_w - 1):
        raise ValueError(f'table of shape {tuple(table.shape)} is not a bias table for window '
                         f'{(old_h, old_w)} ({table_rows((old_h, old_w))} rows expected)')
    if (old_h, old_w) == (new_h, new_w):
        return table.clone()
    heads = table.shape[1]
    grid = table.t().reshape(1, heads, 2 * old_h - 1, 2 * old_w - 1).float()
    grid = torch.nn.functional.interpolate(grid, size=(2 * new_h - 1, 2 * new_w - 1),
                                           mode=mode, align_corners=False)
    return grid.reshape(heads, -1).t().contiguous().to(table.dtype)
