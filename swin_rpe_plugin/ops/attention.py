"""Window attention with an additive bias: fused (SDPA) and explicit paths, one signature.

Imports torch only.
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ['window_attention']


def window_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor,
                     mask: Optional[Tensor] = None, scale: Optional[float] = None,
                     dropout_p: float = 0.0, fused: bool = True) -> Tensor:
    """softmax(q k^T * scale + bias + mask) v over the windows of a batch.

    Args:
        q, k, v: [B * nW, heads, N, head_dim], windows batch-major as produced by
            ``window_partition``.
        bias: [heads, N, N] relative position bias.
        mask: [nW, N, N] additive mask shared by every image, or None.
        scale: logit scale; head_dim ** -0.5 if None.
        dropout_p: attention dropout probability (pass 0 in eval mode).
        fused: use ``F.scaled_dot_product_attention``; otherwise explicit matmul + softmax,
            in the operation order of the reference code (q is scaled before q @ k^T).

    Returns:
        [B * nW, heads, N, head_dim].
    """
    bw, heads, n, head_dim = q.shape
    if bias.shape != (heads, n, n):
        raise ValueError(f'bias must be [heads={heads}, N={n}, N={n}], got {tuple(bias.shape)}')
    scale = head_dim ** -0.5 if scale is None else scale
    if mask is not None:
        nw = mask.shape[0]
        if bw % nw or mask.shape[1:] != (n, n):
            raise ValueError(f'mask [nW, N, N] of shape {tuple(mask.shape)} does not fit '
                             f'{bw} windows of {n} tokens')
        # [B, nW, heads, N, hd] against [nW, heads, N, N]
        q, k, v = (t.view(bw // nw, nw, heads, n, head_dim) for t in (q, k, v))
        bias = bias.unsqueeze(0) + mask.unsqueeze(1).to(bias.dtype)
    if fused:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype),
                                             dropout_p=dropout_p, scale=scale)
    else:
        attn = (q * scale) @ k.transpose(-2, -1)
        attn = (attn + bias).softmax(dim=-1)
        if dropout_p > 0:
            attn = F.dropout(attn, p=dropout_p)
        out = attn @ v
    return out.reshape(bw, heads, n, head_dim)
