"""Pictures of SwinV2's continuous position bias: the MLP's surface per head, at the window the
weights were trained with and at the window the model runs with (matplotlib, PNG).

The surface is 16 * sigmoid(MLP(coords)) over every offset (dy, dx) of a window; with the
coordinates normalised by the pretrained window, the pretrained window's surface is the centre
of the new one (see ``ops/continuous_position.py``).
"""
from typing import Dict

import torch
from torch import Tensor, nn

from ..ops import log_spaced_relative_coords
from ..ops.continuous_position import CPB_BIAS_MAX
from .rpe_plots import DPI, PANEL_INCHES, get_block, plt
from matplotlib.figure import Figure

__all__ = ['cpb_surfaces', 'plot_cpb_surfaces']


@torch.no_grad()
def cpb_surfaces(backbone: nn.Module, stage: int, block: int = 0) -> Dict[str, Tensor]:
    """The bias of one block's MLP on the offset grid of two windows.

    Returns:
        'pretrained': [heads, 2Ph-1, 2Pw-1] over the pretrained window's offsets,
        'window': [heads, 2Mh-1, 2Mw-1] over the model's window; entry (h, dy + M - 1,
        dx + M - 1) is what head h adds for a key (dy, dx) before the query.
    """
    msa = get_block(backbone, stage, block).attn.w_msa
    if not hasattr(msa, 'cpb_mlp'):
        raise TypeError(f'stage {stage} block {block} has no continuous position bias (a Swin '
                        'V1 backbone: draw its tables with plot_bias_tables)')
    out = {}
    for name, window in (('pretrained', msa.pretrained_window_size),
                         ('window', msa.window_size)):
        coords = log_spaced_relative_coords(window, msa.pretrained_window_size,
                                            device=msa.cpb_mlp[0].weight.device)
        table = CPB_BIAS_MAX * torch.sigmoid(msa.cpb_mlp(coords))  # [rows, heads]
        out[name] = table.t().reshape(-1, 2 * window[0] - 1, 2 * window[1] - 1).cpu()
    return out


def plot_cpb_surfaces(backbone: nn.Module, stage: int, path: str, block: int = 0) -> Figure:
    """Two rows of heat-maps, one column per head: pretrained window (top), model window."""
    data = cpb_surfaces(backbone, stage, block)
    heads = data['window'].shape[0]
    fig, axes = plt.subplots(2, heads, squeeze=False, dpi=DPI,
                             figsize=(heads * PANEL_INCHES + 1.0, 2 * PANEL_INCHES + 0.75))
    for row, name in enumerate(('pretrained', 'window')):
        grids = data[name]
        mh, mw = (grids.shape[1] + 1) // 2, (grids.shape[2] + 1) // 2
        extent = (-(mw - 1) - 0.5, mw - 1 + 0.5, mh - 1 + 0.5, -(mh - 1) - 0.5)
        for h in range(heads):
            ax = axes[row, h]
            image = ax.imshow(grids[h].numpy(), cmap='viridis', vmin=0, vmax=CPB_BIAS_MAX,
                              extent=extent, interpolation='nearest')
            ax.set_title(f'head {h}, {name} {mh}x{mw}', fontsize=7)
            ax.tick_params(labelsize=6)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.9, label='bias (0..16)')
    fig.suptitle(f'stage {stage}, block {block}: continuous position bias by offset '
                 '(query - key)', fontsize=9)
    fig.savefig(path, dpi=DPI)
    return fig
