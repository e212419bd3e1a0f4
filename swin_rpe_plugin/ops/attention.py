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
                     dropout_p: float = 0.0, fused: bool = True,
                     windows_per_image: Optional[int] = None) -> Tensor:
    """softmax(q k^T * scale + bias + mask) v over the windows of a batch.

    Args:
        q, k, v: [B * nW, heads, N, head_dim], windows batch-major.
        bias: [heads, N, N] relative position bias, the same for every window.
        mask: [nM, N, N] additive mask of the LAST nM windows of each image (the others are
            unmasked), or None. With windows_per_image None, nM = nW: every window masked.
        scale: logit scale; head_dim ** -0.5 if None.
        dropout_p: attention dropout probability (pass 0 in eval mode).
        fused: ``F.scaled_dot_product_attention``; otherwise explicit matmul + softmax in the
            operation order of the reference code (q scaled before q @ k^T).
        windows_per_image: nW; defaults to mask.shape[0].

    Returns:
        [B * nW, N, heads * head_dim], the layout the output projection takes.
    """
    bw, heads, n, head_dim = q.shape
    if bias.shape != (heads, n, n):
        raise ValueError(f'bias must be [heads={heads}, N={n}, N={n}], got {tuple(bias.shape)}')
    scale = head_dim ** -0.5 if scale is None else scale
    if mask is not None:
        nw = windows_per_image or mask.shape[0]
        if bw % nw or mask.shape[0] > nw or mask.shape[1:] != (n, n):
            raise ValueError(f'mask of shape {tuple(mask.shape)} does not fit {bw} windows of '
                             f'{n} tokens, {nw} per image')
    if not fused:
        return _explicit(q, k, v, bias, mask, scale, dropout_p, windows_per_image)
    # The CPU flash kernel of SDPA takes 4-D inputs and a 4-D mask that broadcasts over the
    # batch ([1, heads, N, N]) or matches it; other shapes fall back to the slower math path.
    # So unmasked windows run in one call with the broadcast bias, and the masked windows of
    # each image in one call with their [nM, heads, N, N] bias + mask: the combined mask is
    # never materialised for every window of every image.
    if mask is None:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.unsqueeze(0).to(q.dtype),
                                             dropout_p=dropout_p, scale=scale)
        return out.transpose(1, 2).reshape(bw, n, heads * head_dim)
    nm = mask.shape[0]
    masked_bias = (bias.unsqueeze(0) + mask.unsqueeze(1).to(bias.dtype)).to(q.dtype)
    plain_bias = bias.unsqueeze(0).to(q.dtype)
    parts = []
    for start in range(0, bw, nw):
        cut = start + nw - nm
        for lo, hi, attn_mask in ((start, cut, plain_bias), (cut, start + nw, masked_bias)):
            if hi > lo:
                parts.append(F.scaled_dot_product_attention(
                    q[lo:hi], k[lo:hi], v[lo:hi], attn_mask=attn_mask, dropout_p=dropout_p,
                    scale=scale).transpose(1, 2))
    return torch.cat(parts).reshape(bw, n, heads * head_dim)


def _explicit(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Optional[Tensor],
              scale: float, dropout_p: float, windows_per_image: Optional[int]) -> Tensor:
    bw, heads, n, head_dim = q.shape
    attn = (q * scale) @ k.transpose(-2, -1) + bias
    if mask is not None:  # [B, nW, heads, N, N] + [nW, 1, N, N]
        nw = windows_per_image or mask.shape[0]
        full = mask.new_zeros(nw, n, n)
        full[nw - mask.shape[0]:] = mask
        attn = attn.view(bw // nw, nw, heads, n, n) + full.unsqueeze(1).to(attn.dtype)
        attn = attn.view(bw, heads, n, n)
    attn = attn.softmax(dim=-1)
    if dropout_p > 0:
        attn = F.dropout(attn, p=dropout_p)
    return (attn @ v).transpose(1, 2).reshape(bw, n, heads * head_dim)
