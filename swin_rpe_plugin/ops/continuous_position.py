"""Continuous position bias and scaled cosine attention of Swin Transformer V2.

Liu et al., 2022, "Swin Transformer V2: Scaling Up Capacity and Resolution", arXiv:2111.09883,
sections 3.2 (scaled cosine attention) and 3.3 (log-spaced continuous position bias).

V1 learns one bias row per offset (dy, dx) of a window (``relative_position.py``); a window of
another size then needs its table interpolated. V2 instead evaluates a small MLP at each offset,
log-spaced and normalised by the window the model was *pretrained* with: run with a larger
window, the model meets the offsets it was trained on at the same coordinates and extrapolates
smoothly (in log space) to the new ones, with no resizing of anything.

The coordinate table's rows follow the V1 table layout (row = (dy + Mh - 1) * (2Mw - 1) +
(dx + Mw - 1)), so :func:`relative_position_index` gathers both.

Imports torch only.
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .relative_position import gather_relative_position_bias, to_window_tuple

__all__ = ['CPB_BIAS_MAX', 'CPB_SPAN', 'LOGIT_SCALE_MAX', 'continuous_position_bias',
           'log_spaced_relative_coords', 'resolve_pretrained_window', 'scaled_cosine_query_key']

LOGIT_SCALE_MAX = math.log(100.0)  # the learned per-head scale is clamped at exp(.) = 100
CPB_SPAN = 8.0  # offsets are scaled to [-8, 8] before the log, as the reference code
CPB_BIAS_MAX = 16.0  # bias = 16 * sigmoid(mlp(coords)), in (0, 16)


def log_spaced_relative_coords(window_size, pretrained_window_size=0, device=None,
                               dtype: torch.dtype = torch.float32) -> Tensor:
    """The MLP's input: every offset (dy, dx) of a window, normalised and log-spaced.

    Each offset d of an axis is scaled to 8 * d / (P - 1), with P the pretrained window on that
    axis (the window itself when 0), then mapped to sign(d') * log2(|d'| + 1) / log2(8). An axis
    of 1 (nothing to normalise by) keeps its only offset, 0.

    Args:
        window_size: M or (Mh, Mw), the window the model runs with.
        pretrained_window_size: P or (Ph, Pw); 0 (or 0 on an axis) means the window itself.

    Returns:
        [(2Mh-1)(2Mw-1), 2] table of (dy, dx) coordinates, rows as the V1 bias table.
    """
    window = to_window_tuple(window_size)
    pretrained = _pretrained_pair(pretrained_window_size)
    axes = []
    for m, p in zip(window, pretrained):
        p = p or m
        d = torch.arange(-(m - 1), m, device=device, dtype=torch.float64)
        axes.append(d * (CPB_SPAN / max(p - 1, 1)))
    dy, dx = torch.meshgrid(axes[0], axes[1], indexing='ij')
    coords = torch.stack([dy, dx], dim=-1).reshape(-1, 2)
    coords = torch.sign(coords) * torch.log2(coords.abs() + 1.0) / math.log2(CPB_SPAN)
    return coords.to(dtype)


def continuous_position_bias(coords_table: Tensor, index: Tensor, hidden_weight: Tensor,
                             hidden_bias: Tensor, out_weight: Tensor) -> Tensor:
    """16 * sigmoid(MLP(coords)) per head, expanded to every (query, key) pair of a window.

    MLP = Linear(2, hidden) -> ReLU -> Linear(hidden, heads, no bias), the reference ``cpb_mlp``.
    The sigmoid runs on the compact table ((2Mh-1)(2Mw-1) rows) before the gather: the same
    values as after it, on fewer entries.

    Args:
        coords_table: [(2Mh-1)(2Mw-1), 2] from :func:`log_spaced_relative_coords`.
        index: [N, N] from :func:`relative_position_index` of the same window.
        hidden_weight, hidden_bias: [hidden, 2], [hidden].
        out_weight: [heads, hidden].

    Returns:
        [heads, N, N] additive bias, values in (0, 16).
    """
    hidden = F.relu(F.linear(coords_table.to(hidden_weight.dtype), hidden_weight, hidden_bias))
    table = CPB_BIAS_MAX * torch.sigmoid(F.linear(hidden, out_weight))
    return gather_relative_position_bias(table, index)


def scaled_cosine_query_key(q: Tensor, k: Tensor, logit_scale: Tensor) -> Tuple[Tensor, Tensor]:
    """Turn cosine attention into plain dot-product attention with scale 1.

    cos(q, k) * s = (s * q / |q|) . (k / |k|), with s = exp(min(logit_scale, log 100)) per head.
    Folding s into q lets the one ``window_attention`` (fused or explicit) run V2 attention
    with ``scale=1.0``.

    Args:
        q, k: [B * nW, heads, N, head_dim].
        logit_scale: [heads, 1, 1], learned, in log space.

    Returns:
        (s * normalize(q), normalize(k)), same shapes.
    """
    scale = torch.clamp(logit_scale, max=LOGIT_SCALE_MAX).exp().to(q.dtype)
    # F.normalize's eps; the scale joins the per-row factor, so q takes one pass, not two.
    q_factor = scale / torch.linalg.vector_norm(q, dim=-1, keepdim=True).clamp_min(1e-12)
    k_factor = 1.0 / torch.linalg.vector_norm(k, dim=-1, keepdim=True).clamp_min(1e-12)
    return q * q_factor, k * k_factor


def _pretrained_pair(pretrained_window_size) -> Tuple[int, int]:
    if isinstance(pretrained_window_size, int) and not isinstance(pretrained_window_size, bool):
        pretrained_window_size = (pretrained_window_size, pretrained_window_size)
    try:
        pair = tuple(int(v) for v in pretrained_window_size)
        ok = len(pair) == 2 and min(pair) >= 0 and all(int(v) == v for v in
                                                         pretrained_window_size)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError('pretrained_window_size must be an int >= 0 or a pair (h, w) of them '
                         f'(0 = the window itself), got {pretrained_window_size!r}')
    return pair


def resolve_pretrained_window(window_size, pretrained_window_size: Optional[object] = 0
                              ) -> Tuple[int, int]:
    """The (h, w) the coordinates are normalised by: the pretrained window, or the window."""
    window = to_window_tuple(window_size)
    pretrained = _pretrained_pair(pretrained_window_size or 0)
    return tuple(p or m for m, p in zip(window, pretrained))
