"""The window plan of a (shifted) window-attention block, built once per size and cached.

Pad -> roll -> partition and its inverse are pure data movement, the same for every block of a
stage. A plan turns each direction into one gather over the token axis:
- ``gather`` [nW * N]: for each window token (windows in plan order, tokens row-major), the
  index of the token of the unpadded [H * W] map it holds, or H * W for padding (a zero row the
  caller appends);
- ``scatter`` [H * W]: for each token of the map, its position in the window order.
Windows are ordered unmasked first, masked last, so the unmasked ones run attention with the
bias alone and only the few masked ones (last window row and column) need a mask.

Imports torch only.
"""
from functools import lru_cache
from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from .masks import window_attention_mask
from .relative_position import to_window_tuple
from .windows import padded_size, window_partition

__all__ = ['WindowPlan', 'window_plan', 'cached_window_plan']


class WindowPlan(NamedTuple):
    gather: Tensor  # [nW * N] long
    scatter: Tensor  # [H * W] long
    needs_pad_row: bool  # gather refers to the appended zero row
    num_windows: int  # nW per image
    mask: Optional[Tensor]  # [nM, N, N] (or [B, nM, N, N] per image) for the last nM windows


def window_plan(hw: Tuple[int, int], window_size, shift_size=(0, 0),
                valid_hw: Optional[Tuple[int, int]] = None, device=None,
                dtype: torch.dtype = torch.float32) -> WindowPlan:
    """Plan of one block on an H x W token map (see the module docstring).

    Args:
        hw: (H, W) of the unpadded map.
        window_size: M or (Mh, Mw).
        shift_size: cyclic shift (sh, sw), each in [0, M).
        valid_hw: tokens outside this top-left region are masked as keys: one (h, w) for all
            images, a tuple of (h, w) per image (the mask is then [B, nM, N, N], nM counting
            the windows masked for any image), or None (no padding mask).
    """
    window = to_window_tuple(window_size)
    h, w = hw
    hp, wp = padded_size(hw, window)
    shift = (shift_size, shift_size) if isinstance(shift_size, int) else tuple(shift_size)
    # Source index of every token of the padded, rolled map: rolled (y, x) holds the padded
    # map's ((y + sh) % Hp, (x + sw) % Wp), which is padding outside H x W.
    ys = (torch.arange(hp, device=device) + shift[0]) % hp
    xs = (torch.arange(wp, device=device) + shift[1]) % wp
    inside = (ys[:, None] < h) & (xs[None, :] < w)
    source = torch.where(inside, ys[:, None] * w + xs[None, :], h * w)
    windows, _ = window_partition(source[None, :, :, None], window)  # [nW, N, 1]
    windows = windows[..., 0]

    per_image = valid_hw is not None and not isinstance(valid_hw[0], int)
    masks = [window_attention_mask((hp, wp), window, shift, v, device, dtype)
             for v in (valid_hw if per_image else [valid_hw])]
    if all(m is None for m in masks):
        order = torch.arange(windows.shape[0], device=device)
        mask = None
    else:
        n = window[0] * window[1]
        full = torch.stack([torch.zeros(windows.shape[0], n, n, device=device, dtype=dtype)
                            if m is None else m for m in masks])  # [B or 1, nW, N, N]
        masked = (full != 0).flatten(2).any(2).any(0)
        order = torch.cat([torch.nonzero(~masked)[:, 0], torch.nonzero(masked)[:, 0]])
        mask = full[:, masked].contiguous() if masked.any() else None
        if mask is not None and not per_image:
            mask = mask[0]
    gather = windows[order].reshape(-1)
    real = gather < h * w
    scatter = torch.empty(h * w, dtype=torch.long, device=device)
    scatter[gather[real]] = torch.nonzero(real)[:, 0]
    return WindowPlan(gather, scatter, bool((~real).any()), windows.shape[0], mask)


@lru_cache(maxsize=64)
def _cached_plan(*args) -> WindowPlan:
    return window_plan(*args)


@torch.compiler.disable  # data-dependent (nonzero): built eagerly, once per size, then cached
def cached_window_plan(hw: Tuple[int, int], window_size: Tuple[int, int],
                       shift_size: Tuple[int, int], valid_hw: Optional[tuple],
                       device: torch.device, dtype: torch.dtype) -> WindowPlan:
    """:func:`window_plan` in a bounded LRU cache (64 entries); arguments must be hashable.

    The returned tensors are shared between callers: never modify them in place.
    ``cache_info()`` and ``cache_clear()`` are those of the LRU cache.
    """
    return _cached_plan(hw, window_size, shift_size, valid_hw, device, dtype)


cached_window_plan.cache_info = _cached_plan.cache_info
cached_window_plan.cache_clear = _cached_plan.cache_clear
