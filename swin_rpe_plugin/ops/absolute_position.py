"""Absolute position embedding resize (load time and run time). Imports torch only."""
import torch.nn.functional as F
from torch import Tensor

from .relative_position import to_window_tuple

__all__ = ['resize_absolute_pos_embed']


def resize_absolute_pos_embed(embed: Tensor, old_grid, new_grid, mode: str = 'bicubic') -> Tensor:
    """Resample an absolute position embedding on its patch grid.

    Args:
        embed: [1, Ho*Wo, C] or [1, Ho, Wo, C].
        old_grid, new_grid: (H, W) patch grids (an int means square).
        mode: 'bicubic' or 'bilinear'.

    Returns:
        [1, Hn*Wn, C] with embed's dtype.
    """
    if mode not in ('bicubic', 'bilinear'):
        raise ValueError(f"mode must be 'bicubic' or 'bilinear', got {mode!r}")
    oh, ow = to_window_tuple(old_grid, 'old_grid')
    nh, nw = to_window_tuple(new_grid, 'new_grid')
    if embed.dim() == 4:
        embed = embed.reshape(embed.shape[0], -1, embed.shape[-1])
    if embed.dim() != 3 or embed.shape[0] != 1 or embed.shape[1] != oh * ow:
        raise ValueError(f'absolute_pos_embed of shape {tuple(embed.shape)} does not fit grid '
                         f'{(oh, ow)} ([1, {oh * ow}, C] expected)')
    if (oh, ow) == (nh, nw):
        return embed.clone()
    c = embed.shape[-1]
    grid = embed.reshape(1, oh, ow, c).permute(0, 3, 1, 2).float()
    grid = F.interpolate(grid, size=(nh, nw), mode=mode, align_corners=False)
    return grid.flatten(2).transpose(1, 2).contiguous().to(embed.dtype)
