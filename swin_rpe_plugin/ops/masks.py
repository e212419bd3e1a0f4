"""Attention masks for (shifted) window attention (cached through ops/plan.py).

Masked entries hold MASK_VALUE = -100, the value of the reference Swin code (and mmdet/mmseg),
added to the logits before softmax. We keep -100 rather than -inf for two reasons: outputs stay
bit-comparable with the stock toolkits, and a window whose keys are all masked (a window made
only of padding) still gets a finite softmax instead of NaN. exp(-100) is below float32's
resolution next to any unmasked key, so a masked key gets no weight that float32 can represent.

Imports torch only.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .relative_position import to_window_tuple
from .windows import window_partition

__all__ = ['MASK_VALUE', 'region_mask', 'shift_region_labels', 'shift_attention_mask', 'padding_key_mask',
           'window_attention_mask']

MASK_VALUE = -100.0


def _axis_labels(size: int, window: int, shift: int, device) -> Tensor:
    # The three slices of the reference per axis: [0, -M), [-M, -shift), [-shift, end).
    # With shift 0 the last slice is empty (the reference's slice(-0, None) would be the whole
    # axis, a trap for rectangular windows with a side of 1).
    pos = torch.arange(size, device=device)
    labels = (pos >= size - window).long()
    if shift > 0:
        labels += (pos >= size - shift).long()
    return labels


def shift_region_labels(padded_hw: Tuple[int, int], window_size, shift_size,
                        device=None) -> Tensor:
    """Region label of every token of the rolled, padded map: [Hp, Wp] with values in 0..8.

    Tokens with different labels were not neighbours before the cyclic shift.
    """
    mh, mw = to_window_tuple(window_size)
    sh, sw = _shift_tuple(shift_size, (mh, mw))
    hp, wp = padded_hw
    ly = _axis_labels(hp, mh, sh, device)
    lx = _axis_labels(wp, mw, sw, device)
    return ly[:, None] * 3 + lx[None, :]


def shift_attention_mask(padded_hw: Tuple[int, int], window_size, shift_size,
                         device=None, dtype: torch.dtype = torch.float32) -> Tensor:
    """Mask of the shifted-window attention for a padded map.

    Args:
        padded_hw: (Hp, Wp), multiples of the window.
        window_size: M or (Mh, Mw).
        shift_size: s or (sh, sw), each in [0, M).

    Returns:
        [nW, N, N] with 0 where query and key come from the same region, MASK_VALUE elsewhere.
    """
    _check_padded(padded_hw, window_size)
    labels = shift_region_labels(padded_hw, window_size, shift_size, device)
    win, _ = window_partition(labels[None, :, :, None], window_size)  # [nW, N, 1]
    win = win[..., 0]
    different = win[:, :, None] != win[:, None, :]
    return torch.zeros(different.shape, device=device, dtype=dtype).masked_fill_(
        different, MASK_VALUE)


def padding_key_mask(padded_hw: Tuple[int, int], valid_hw: Tuple[int, int], window_size,
                     shift_size=0, device=None, dtype: torch.dtype = torch.float32) -> Tensor:
    """Mask that keeps keys outside the valid top-left region out of attention.

    The padded map is rolled by -shift like the features, so the mask follows the keys to
    where the cyclic shift moved them.

    Returns:
        [nW, 1, N]: MASK_VALUE at keys outside valid_hw, 0 elsewhere (broadcasts over queries).
    """
    _check_padded(padded_hw, window_size)
    hp, wp = padded_hw
    h, w = valid_hw
    if not (0 <= h <= hp and 0 <= w <= wp):
        raise ValueError(f'valid_hw {valid_hw} must lie inside padded_hw {padded_hw}')
    window = to_window_tuple(window_size)
    sh, sw = _shift_tuple(shift_size, window)
    invalid = torch.ones(hp, wp, dtype=torch.bool, device=device)
    invalid[:h, :w] = False
    invalid = torch.roll(invalid, shifts=(-sh, -sw), dims=(0, 1))
    win, _ = window_partition(invalid[None, :, :, None], window)  # [nW, N, 1]
    mask = torch.zeros(win.shape[0], 1, win.shape[1], device=device, dtype=dtype)
    return mask.masked_fill_(win[..., 0][:, None, :], MASK_VALUE)


def window_attention_mask(padded_hw: Tuple[int, int], window_size, shift_size=0,
                          valid_hw: Optional[Tuple[int, int]] = None, device=None,
                          dtype: torch.dtype = torch.float32) -> Optional[Tensor]:
    """The whole additive mask of one block: shift regions and, if given, padded keys.

    Returns:
        [nW, N, N] or None when nothing is masked (no shift and no padding to hide).
    """
    window = to_window_tuple(window_size)
    shift = _shift_tuple(shift_size, window)
    mask = None
    if shift != (0, 0):
        mask = shift_attention_mask(padded_hw, window, shift, device, dtype)
    if valid_hw is not None and tuple(valid_hw) != tuple(padded_hw):
        pad_mask = padding_key_mask(padded_hw, valid_hw, window, shift, device, dtype)
        mask = pad_mask.expand(-1, pad_mask.shape[-1], -1) if mask is None else mask + pad_mask
        # Two reasons to mask one key still mean "masked": keep a single value.
        mask = mask.clamp(min=MASK_VALUE).contiguous()
    return mask


def _shift_tuple(shift_size, window: Tuple[int, int]) -> Tuple[int, int]:
    shift = (shift_size, shift_size) if isinstance(shift_size, int) else tuple(shift_size)
    if len(shift) != 2 or not all(0 <= s < m for s, m in zip(shift, window)):
        raise ValueError(f'shift_size must be in [0, window) on each side, got {shift_size!r} '
                         f'for window {window}')
    return shift


def _check_padded(padded_hw, window_size) -> None:
    mh, mw = to_window_tuple(window_size)
    if padded_hw[0] % mh or padded_hw[1] % mw:
        raise ValueError(f'padded_hw {tuple(padded_hw)} is not a multiple of window {(mh, mw)}')


def region_mask(valid, hw, like: Tensor) -> Tensor:
    """[B, 1, H, W] in ``like``'s dtype: 1 inside each image's top-left (h, w) region of
    ``valid`` (one (h, w) per image), 0 outside."""
    rows = torch.arange(hw[0], device=like.device)
    cols = torch.arange(hw[1], device=like.device)
    sizes = torch.tensor([list(v) for v in valid], device=like.device).view(-1, 2)
    inside = (rows[None, :, None] < sizes[:, 0, None, None]) & \
        (cols[None, None, :] < sizes[:, 1, None, None])
    return inside.to(like.dtype).unsqueeze(1)
