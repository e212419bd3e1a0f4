"""Window partition with padding, and the gather of tokens that window plans use.

Padding is bottom/right ("corner"), as in mmdet/mmseg, so that token (0, 0) stays at the
top-left and unpadded sizes are recovered by cropping. Imports torch only.
"""
from typing import Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ..compat import HAS_CUSTOM_OP, is_compiling
from .relative_position import to_window_tuple

__all__ = ['padded_size', 'pad_to_window', 'window_partition', 'gather_tokens']

# Where a gather's output has zero tokens: nowhere, where the index holds L, or these positions.
Zeros = Union[bool, Tensor]


def padded_size(hw: Tuple[int, int], window_size) -> Tuple[int, int]:
    """(H, W) rounded up to multiples of the window (Mh, Mw)."""
    mh, mw = to_window_tuple(window_size)
    h, w = hw
    # Not -(-h // m) * m: traced into ONNX, Div truncates and the ceiling becomes a floor.
    return (h + mh - 1) // mh * mh, (w + mw - 1) // mw * mw


def pad_to_window(x: Tensor, window_size) -> Tuple[Tensor, Tuple[int, int]]:
    """Zero-pad a [B, H, W, C] map at the bottom and right up to multiples of the window.

    Returns:
        The padded map [B, Hp, Wp, C] and the padding (pad_h, pad_w) it applied.
    """
    if x.dim() != 4:
        raise ValueError(f'x must be [B, H, W, C], got shape {tuple(x.shape)}')
    h, w = x.shape[1:3]
    hp, wp = padded_size((h, w), window_size)
    pad = (hp - h, wp - w)
    if pad != (0, 0):
        x = F.pad(x, (0, 0, 0, pad[1], 0, pad[0]))
    return x, pad


def window_partition(x: Tensor, window_size) -> Tuple[Tensor, Tuple[int, int]]:
    """Split a [B, H, W, C] map into non-overlapping windows, padding it first if needed.

    Returns:
        windows [B * nW, Mh * Mw, C] (batch-major, windows row-major) and the padding
        (pad_h, pad_w) that was applied.
    """
    mh, mw = to_window_tuple(window_size)
    x, pad = pad_to_window(x, (mh, mw))
    b, hp, wp, c = x.shape
    x = x.view(b, hp // mh, mh, wp // mw, mw, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, mh * mw, c), pad


class _GatherTokens(torch.autograd.Function):
    """x[:, index] with zero tokens where ``zero_in_index`` says; backward gathers with the
    inverse."""

    @staticmethod
    def forward(ctx, x: Tensor, index: Tensor, inverse: Tensor, zero_in_index: Zeros,
                zero_in_inverse: Zeros) -> Tensor:
        ctx.save_for_backward(inverse)
        ctx.zero_in_inverse = zero_in_inverse
        return _gather(x, index, zero_in_index)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (inverse, ) = ctx.saved_tensors
        return _gather(grad.contiguous(), inverse, ctx.zero_in_inverse), None, None, None, None


def _gather(x: Tensor, index: Tensor, zeros: Zeros) -> Tensor:
    if isinstance(zeros, Tensor):
        # One gather, then the few zero tokens written: appending the zero row instead copies
        # all of x first (a read and a write of every token, for one row).
        return x.index_select(1, index).index_fill_(1, zeros, 0)
    return (F.pad(x, (0, 0, 0, 1)) if zeros else x).index_select(1, index)


def gather_tokens(x: Tensor, index: Tensor, inverse: Tensor, zero_in_index: Zeros = False,
                  zero_in_inverse: Zeros = False) -> Tensor:
    """Reorder the tokens of [B, L, C], inserting zero tokens where index says so.

    Args:
        x: [B, L, C].
        index: [L'] source token of each output token.
        inverse: [L] position of each input token in the output. Each input token appears at
            most once in the output, so the gradient is again a gather, instead of the
            scatter-add autograd would run for an index.
        zero_in_index: where the output has zero tokens (padding). False: nowhere. True: where
            index holds L (x is copied with a zero row appended; tracers take this). A tensor:
            the output positions of the zero tokens, index holding any valid row there (one
            gather, the zeros written after it): a plan's ``window_index()``.
        zero_in_inverse: the same for inverse (the output drops those tokens, so the
            gradient has zeros there): False, True (inverse holds L') or positions.

    Returns:
        [B, L', C].
    """
    # Tracers (FLOP counters) see plain ops; so does compile below torch 2.5, whose dynamo
    # cannot trace this Function's backward with the plan's tensors as graph inputs.
    if (not (torch.is_grad_enabled() and x.requires_grad) or torch.jit.is_tracing()
            or (is_compiling() and not HAS_CUSTOM_OP)):
        return _gather(x, index, zero_in_index)
    return _GatherTokens.apply(x, index, inverse, zero_in_index, zero_in_inverse)
