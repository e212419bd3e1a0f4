"""Pictures of the relative position bias, the shift mask and window attention (matplotlib, PNG).

Each picture has a data function (returns tensors, tested against the model and ``ops``) and a
plot function that calls it and draws exactly what it returned. Plot functions return the
matplotlib Figure after saving it, so callers can inspect the panels; close it when done.
"""
import math
from typing import Dict, Optional, Tuple

import matplotlib

matplotlib.use('Agg')  # files only: no display here, and none needed
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from ..ops import (MASK_VALUE, pad_to_window, shift_attention_mask,  # noqa: E402
                   shift_region_labels, to_window_tuple, window_attention_mask,
                   window_partition)

__all__ = ['get_block', 'bias_table_grids', 'bias_matrix', 'shift_mask_data', 'query_attention',
           'plot_bias_tables', 'plot_bias_matrix', 'plot_shift_mask', 'plot_attention', 'close']

# Shown on a picture of an all-zero table: mmdet and mmseg never initialise the tables, so an
# untrained model or a checkpoint saved from one draws blank, which otherwise reads as a bug.
ZERO_NOTE = ('ALL ZERO: never initialised or trained (mmdet/mmseg leave bias tables at zero); '
             'load trained weights to see a pattern')
PANEL_INCHES = 1.75  # sizes in quarter inches: exact pixel sizes at any DPI
DPI = 100


def get_block(backbone: nn.Module, stage: int, block: int) -> nn.Module:
    """The SwinBlock ``backbone.stages[stage].blocks[block]``, with a clear error."""
    if not 0 <= stage < len(backbone.stages):
        raise ValueError(f'stage {stage} out of range: the backbone has {len(backbone.stages)}')
    blocks = backbone.stages[stage].blocks
    if not 0 <= block < len(blocks):
        raise ValueError(f'block {block} out of range: stage {stage} has {len(blocks)} blocks')
    return blocks[block]


def bias_table_grids(backbone: nn.Module, stage: int, block: int = 0) -> Tensor:
    """The compact bias table of one block on its offset grid.

    Returns:
        [heads, 2Mh-1, 2Mw-1]; entry (h, dy + Mh - 1, dx + Mw - 1) is the bias head h adds when
        the key lies (dy, dx) before the query (query minus key), the row layout of ops/.
    """
    msa = get_block(backbone, stage, block).attn.w_msa
    mh, mw = msa.window_size
    table = msa.relative_position_bias_table.detach()
    return table.t().reshape(table.shape[1], 2 * mh - 1, 2 * mw - 1).clone()


def bias_matrix(backbone: nn.Module, stage: int, block: int, head: int) -> Tensor:
    """[N, N] bias of one head as the attention adds it (query rows, key columns)."""
    msa = get_block(backbone, stage, block).attn.w_msa
    if not 0 <= head < msa.num_heads:
        raise ValueError(f'head {head} out of range: stage {stage} has {msa.num_heads} heads')
    return msa.relative_position_bias()[head].detach()


def shift_mask_data(padded_hw: Tuple[int, int], window, shift) -> Dict[str, Tensor]:
    """Region labels [Hp, Wp] of the rolled map and the mask [nW, N, N] of ops.masks."""
    return dict(labels=shift_region_labels(padded_hw, window, shift),
                mask=shift_attention_mask(padded_hw, window, shift))


@torch.no_grad()
def query_attention(backbone: nn.Module, image: Tensor, stage: int, block: int, head: int,
                    query: Optional[Tuple[int, int]] = None) -> Dict[str, Tensor]:
    """Attention of one query token over the token map, with and without the position bias.

    Only the block's input (after norm1) is taken from the model; windows and masks come from
    ops/, so the picture does not depend on how the block schedules its windows.

    Args:
        image: [1, 3, H, W], normalised as the model expects.
        query: (y, x) on the token map of ``stage``; None: the centre token.

    Returns:
        'with_bias', 'without_bias': [h, w] maps on the stage's token grid (zero outside the
        query's window; shift and padding masks apply to both), 'hw': (h, w), 'query': (y, x),
        'window_probs': [2, N] the two rows in window order (padding keys included).
    """
    blk = get_block(backbone, stage, block)
    captured = {}

    def grab(module, args, kwargs):  # ShiftWindowMSA(query [B, H*W, C], hw_shape, plan, norm)
        norm = kwargs.get('norm', args[3] if len(args) > 3 else None)
        x = args[0] if norm is None else norm(args[0])  # the block passes norm1 to fuse it
        captured.update(x=x, hw=tuple(args[1]))

    handle = blk.attn.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        backbone.eval()(image)
    finally:
        handle.remove()
    h, w = captured['hw']
    qy, qx = (h // 2, w // 2) if query is None else tuple(query)
    if not (0 <= qy < h and 0 <= qx < w):
        raise ValueError(f'query {query} is outside the {h}x{w} token map of stage {stage}')
    attn, msa = blk.attn, blk.attn.w_msa
    if not 0 <= head < msa.num_heads:
        raise ValueError(f'head {head} out of range: stage {stage} has {msa.num_heads} heads')
    c = captured['x'].shape[-1]
    x, _ = pad_to_window(captured['x'][:1].view(1, h, w, c), attn.window_size)
    hp, wp = x.shape[1:3]
    ids = torch.arange(hp * wp).view(1, hp, wp, 1)  # where each token sits before the shift
    sh, sw = attn.shift_size
    x, ids = (torch.roll(t, shifts=(-sh, -sw), dims=(1, 2)) for t in (x, ids))
    windows, _ = window_partition(x, attn.window_size)  # [nW, N, C]
    id_windows, _ = window_partition(ids, attn.window_size)  # [nW, N, 1]
    win, pos = torch.nonzero(id_windows[..., 0] == qy * wp + qx)[0].tolist()
    # The module's own hooks: V1's qkv bias and scale, or SwinV2's q/v bias and cosine form.
    qkv = torch.nn.functional.linear(windows[win], msa.qkv.weight, msa.qkv_projection_bias())
    qkv = qkv.reshape(-1, 3, msa.num_heads, c // msa.num_heads).permute(1, 2, 0, 3)
    q, k, scale = msa.query_key(qkv[0][None], qkv[1][None])  # [1, heads, N, head_dim]
    logits = (q[0, head] * scale) @ k[0, head].t()
    valid = (h, w) if getattr(backbone.stages[stage], 'mask_padding', False) else None
    mask = window_attention_mask((hp, wp), attn.window_size, attn.shift_size, valid)
    if mask is not None:
        logits = logits + mask[win]
    rows = torch.stack([(logits + msa.relative_position_bias()[head]).softmax(-1)[pos],
                        logits.softmax(-1)[pos]])
    maps = torch.zeros(2, hp * wp).index_copy_(1, id_windows[win, :, 0], rows)
    maps = maps.view(2, hp, wp)[:, :h, :w]
    return {'with_bias': maps[0], 'without_bias': maps[1], 'hw': (h, w), 'query': (qy, qx),
            'window_probs': rows}


def _grid(n: int, max_cols: int = 8) -> Tuple[int, int]:
    cols = min(n, max_cols)
    return math.ceil(n / cols), cols


def plot_bias_tables(backbone: nn.Module, stage: int, path: str, block: int = 0) -> Figure:
    """One heat-map per head of a block's bias table, axes in offsets, one shared colour bar."""
    grids = bias_table_grids(backbone, stage, block)
    heads, rh, rw = grids.shape
    mh, mw = (rh + 1) // 2, (rw + 1) // 2
    rows, cols = _grid(heads)
    fig, axes = plt.subplots(rows, cols, squeeze=False, dpi=DPI,
                             figsize=(cols * PANEL_INCHES + 1.0, rows * PANEL_INCHES + 0.5))
    limit = float(grids.abs().max()) or 1.0
    extent = (-(mw - 1) - 0.5, mw - 1 + 0.5, mh - 1 + 0.5, -(mh - 1) - 0.5)
    for i, ax in enumerate(axes.flat):
        if i >= heads:
            ax.set_visible(False)
            continue
        image = ax.imshow(grids[i].numpy(), cmap='RdBu_r', vmin=-limit, vmax=limit,
                          extent=extent, interpolation='nearest')
        ax.set_title(f'head {i}' + (' (all zero)' if not grids[i].any() else ''), fontsize=8)
        ax.tick_params(labelsize=6)
        if i % cols == 0:
            ax.set_ylabel('dy', fontsize=7)
        if i // cols == rows - 1 or i + cols >= heads:
            ax.set_xlabel('dx', fontsize=7)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.9, label='bias')
    fig.suptitle(f'stage {stage}, block {block}: bias by offset (query - key), '
                 f'window {mh}x{mw}' + ('' if grids.any() else f'\n{ZERO_NOTE}'), fontsize=9)
    fig.savefig(path, dpi=DPI)
    return fig


def plot_bias_matrix(backbone: nn.Module, stage: int, block: int, head: int,
                     path: str) -> Figure:
    """The full [N, N] bias matrix of one head (what the attention logits get)."""
    matrix = bias_matrix(backbone, stage, block, head)
    fig, ax = plt.subplots(figsize=(5.25, 4.5), dpi=DPI)
    image = ax.imshow(matrix.numpy(), cmap='RdBu_r', interpolation='nearest')
    ax.set_xlabel('key token (y * Mw + x)')
    ax.set_ylabel('query token (y * Mw + x)')
    ax.set_title(f'stage {stage}, block {block}, head {head}: bias B'
                 + ('' if matrix.any() else '\n' + ZERO_NOTE.replace('; ', ';\n')), fontsize=9)
    fig.colorbar(image, ax=ax, label='bias')
    fig.savefig(path, dpi=DPI)
    return fig


def plot_shift_mask(padded_hw: Tuple[int, int], window, shift, path: str) -> Figure:
    """Left: regions of the rolled map, windows outlined. Right: each window's [N, N] mask."""
    data = shift_mask_data(padded_hw, window, shift)
    labels, mask = data['labels'], data['mask']
    hp, wp = padded_hw
    mh, mw = to_window_tuple(window)
    n = mh * mw
    nwh, nww = hp // mh, wp // mw
    mosaic = mask.view(nwh, nww, n, n).permute(0, 2, 1, 3).reshape(nwh * n, nww * n)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.5), dpi=DPI)
    left.imshow(labels.numpy(), cmap='tab10', vmin=0, vmax=9, interpolation='nearest')
    right.imshow(mosaic.numpy(), cmap='gray', vmin=MASK_VALUE, vmax=0, interpolation='nearest')
    for wy in range(nwh):
        for wx in range(nww):
            left.add_patch(Rectangle((wx * mw - 0.5, wy * mh - 0.5), mw, mh, fill=False,
                                     edgecolor='black', linewidth=1.2))
            right.add_patch(Rectangle((wx * n - 0.5, wy * n - 0.5), n, n, fill=False,
                                      edgecolor='tab:red', linewidth=0.8))
    left.set_title(f'regions of the {hp}x{wp} map rolled by {shift}, windows outlined',
                   fontsize=8)
    right.set_title('mask per window (black = -100, query rows, key columns)', fontsize=8)
    fig.savefig(path, dpi=DPI)
    return fig


def plot_attention(backbone: nn.Module, image: Tensor, rgb: Tensor, stage: int, block: int,
                   head: int, query: Optional[Tuple[int, int]], path: str) -> Figure:
    """Image with the query marked, and the query's attention overlaid with and without bias.

    Args:
        image: [1, 3, H, W] model input; rgb: [H, W, 3] uint8 picture to draw on.
    """
    data = query_attention(backbone, image, stage, block, head, query)
    h, w = data['hw']
    query = data['query']
    height, width = rgb.shape[:2]
    sy, sx = height / h, width / w
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.5), dpi=DPI)
    titles = ('query token', 'attention with bias', 'attention without bias')
    top = float(torch.maximum(data['with_bias'].max(), data['without_bias'].max()))
    for ax, key, title in zip(axes, (None, 'with_bias', 'without_bias'), titles):
        ax.imshow(rgb.numpy())
        if key is not None:  # one colour scale for both, so they compare
            ax.imshow(data[key].numpy(), cmap='inferno', alpha=0.6, interpolation='nearest',
                      extent=(0, width, height, 0), vmin=0, vmax=top)
        ax.add_patch(Rectangle((query[1] * sx, query[0] * sy), sx, sy, fill=False,
                               edgecolor='cyan', linewidth=1.5))
        ax.set_title(f'{title}', fontsize=9)
        ax.axis('off')
    fig.suptitle(f'stage {stage}, block {block}, head {head}, query {tuple(query)}', fontsize=9)
    fig.savefig(path, dpi=DPI)
    return fig


def close(fig: Optional[Figure]) -> None:
    """Free a figure returned by a plot function."""
    if fig is not None:
        plt.close(fig)

