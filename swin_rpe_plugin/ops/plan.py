"""The window plan of a (shifted) window-attention block, built once per size and cached.

Pad -> roll -> partition and its inverse are pure data movement, the same for every block of a
stage. A plan turns each direction into one gather over the token axis:
- ``gather`` [nW * N]: for each window token (windows in plan order, tokens row-major), the
  index of the token of the unpadded [H * W] map it holds, or H * W for padding (a zero row the
  caller appends); eager plans also give ``gather_rows`` (the same with any valid row at the
  padding) and ``pad_positions`` (where the padding is), so the gather need not copy the map
  to append that row (:meth:`WindowPlan.window_index`);
- ``scatter`` [H * W]: for each token of the map, its position in the window order.
Windows are ordered unmasked first, masked last, so the unmasked ones run attention with the
bias alone and only the few masked ones (last window row and column) need a mask.

The ordering needs ``nonzero`` and Python branches on tensor values, which the ``meta`` device
cannot run and which force a host sync on CUDA. So :func:`window_plan` always builds on the
CPU and moves the finished tensors to the requested device in one copy each;
:func:`cached_window_plan` keeps the moved plan per size and device, so that copy happens once.

:func:`traceable_window_plan` builds the same plan from coordinate arithmetic alone, in plain
window order with a mask for every window: no data-dependent op, no branch on a size, no cache.
Tracers and exporters (ONNX, torch.export, torch.compile) take it, so sizes may be symbolic.

Imports torch only.
"""
from functools import lru_cache
from typing import NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor

from ..compat import compiler_disable, default_device, index_sizes
from .masks import MASK_VALUE, window_attention_mask
from .relative_position import to_window_tuple
from .windows import padded_size, window_partition

__all__ = ['WindowPlan', 'window_plan', 'cached_window_plan', 'traceable_window_plan']


class WindowPlan(NamedTuple):
    gather: Tensor  # [nW * N] long
    scatter: Tensor  # [H * W] long
    needs_pad_row: bool  # gather refers to the appended zero row
    num_windows: int  # nW per image
    mask: Optional[Tensor]  # [nM, N, N] (or [B, nM, N, N] per image) for the last nM windows
    gather_rows: Optional[Tensor] = None  # gather with row 0 at the padding (eager plans)
    pad_positions: Optional[Tensor] = None  # [P] long: where gather holds H * W

    def window_index(self) -> Tuple[Tensor, Union[bool, Tensor]]:
        """(index, zeros) for ``gather_tokens`` into window order: the padding's positions
        where the plan has them (one gather, no copy of the map), else the appended zero row
        (traceable plans)."""
        if self.pad_positions is not None:
            return self.gather_rows, self.pad_positions
        return self.gather, self.needs_pad_row


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
        device: where the plan's tensors go (None: the default device); built on the CPU,
            then moved (see the module docstring).
    """
    plan = _cpu_window_plan(hw, window_size, shift_size, valid_hw, dtype)
    device = default_device() if device is None else torch.device(device)
    if device.type == 'cpu':
        return plan
    moved = {name: getattr(plan, name).to(device) for name in
             ('gather', 'scatter', 'mask', 'gather_rows', 'pad_positions')
             if getattr(plan, name) is not None}
    return plan._replace(**moved)


def _cpu_window_plan(hw, window_size, shift_size, valid_hw, dtype: torch.dtype) -> WindowPlan:
    """:func:`window_plan` on the CPU, whatever the default device."""
    device = torch.device('cpu')
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
    if real.all():
        return WindowPlan(gather, scatter, False, windows.shape[0], mask)
    return WindowPlan(gather, scatter, True, windows.shape[0], mask,
                      torch.where(real, gather, 0), torch.nonzero(~real)[:, 0])


@lru_cache(maxsize=64)
def _cached_plan(*args) -> WindowPlan:
    return window_plan(*args)


@compiler_disable  # data-dependent (nonzero): built eagerly, once per size, then cached
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


def traceable_window_plan(hw, window_size: Tuple[int, int], shift_size: Tuple[int, int],
                          valid_hw=None, device=None,
                          dtype: torch.dtype = torch.float32) -> WindowPlan:
    """The plan of :func:`window_plan` from arithmetic on token coordinates.

    Windows stay in row-major order (no masked-last reordering, which needs ``nonzero``), the
    mask covers every window ([nW, N, N]; None only when nothing can be masked: no shift and
    no valid_hw), and the gather always may refer to the zero row. All sizes may be symbolic
    (SymInts under torch.export, traced sizes under torch.jit/ONNX) and only non-negative
    integers are divided, where floor and truncation agree (ONNX's Div truncates).

    Args:
        hw: (H, W) of the unpadded map; window_size: (Mh, Mw); shift_size: (sh, sw).
        valid_hw: one (h, w) region for all images whose outside is masked as keys, or None.
    """
    (mh, mw), (sh, sw) = window_size, shift_size
    h, w = hw
    hp, wp = (h + mh - 1) // mh * mh, (w + mw - 1) // mw * mw
    windows_x, n = wp // mw, mh * mw
    num_windows, num_tokens = (hp // mh) * windows_x, h * w
    # Sizes as they enter the arithmetic below: themselves, or tensors on an old compiler.
    h, w, hp, wp, windows_x = index_sizes(device, h, w, hp, wp, windows_x)
    # Rolled-map coordinates (y, x) of token t of window i, [nW, N].
    i = torch.arange(num_windows, device=device)[:, None]
    t = torch.arange(n, device=device)[None, :]
    y = (i // windows_x) * mh + t // mw
    x = _mod(i, windows_x) * mw + t % mw
    # The padded, unrolled map's coordinates they hold: roll by -shift reads (y + s) mod size.
    src_y, src_x = _mod(y + sh, hp), _mod(x + sw, wp)
    gather = torch.where(torch.logical_and(src_y < h, src_x < w), src_y * w + src_x,
                         h * w).reshape(-1)
    # Position of each map token in window order: the inverse of the above, by arithmetic.
    token = torch.arange(num_tokens, device=device)
    ry, rx = _mod(token // w + hp - sh, hp), _mod(_mod(token, w) + wp - sw, wp)
    scatter = ((ry // mh) * windows_x + rx // mw) * n + (ry % mh) * mw + rx % mw

    mask = None
    if (sh, sw) != (0, 0):  # regions of the reference's three slices per axis
        label_y = (y >= hp - mh).long() + ((y >= hp - sh).long() if sh else 0)
        label_x = (x >= wp - mw).long() + ((x >= wp - sw).long() if sw else 0)
        region = label_y * 3 + label_x
        mask = torch.where(region[:, :, None] != region[:, None, :],
                           torch.tensor(MASK_VALUE, dtype=dtype, device=device),
                           torch.tensor(0.0, dtype=dtype, device=device))
    if valid_hw is not None:
        valid_h, valid_w = index_sizes(device, *valid_hw)
        invalid_key = torch.logical_or(src_y >= valid_h, src_x >= valid_w)  # [nW, N]
        keys = torch.where(invalid_key[:, None, :],
                           torch.tensor(MASK_VALUE, dtype=dtype, device=device),
                           torch.tensor(0.0, dtype=dtype, device=device))
        mask = keys.expand(-1, n, -1) if mask is None else (mask + keys).clamp(min=MASK_VALUE)
    return WindowPlan(gather, scatter, True, num_windows, mask)


def _mod(a: Tensor, b) -> Tensor:
    """a mod b for a >= 0 and a size b (possibly symbolic), as a - (a // b) * b: the ONNX
    exporter's remainder takes only constant divisors."""
    return a - (a // b) * b
