"""Window attention with an additive bias: fused (SDPA) and explicit paths, one signature.

The generic path (every device but the CPU fast path's, ``dispatch.py``) is one SDPA call per layer
for all windows of all images, bias (+ mask) broadcast, autograd through SDPA's own fused backward:
no loop, no registered op, the same ops in eager mode and under tracers and compilers
(:func:`generic_window_attention`). On a GPU each kernel launch costs host time whatever its size,
so the number of calls, not bytes, is what that path minimises (docs/performance.md).

The CPU fast path splits each image's windows into unmasked ones (one SDPA call, the broadcast
bias) and masked ones (one call, bias + mask [nM, heads, N, N]); without dropout it is the
registered op ``swin_rpe::window_attention`` (``swin_rpe::window_attention_qkv`` for the packed
qkv of Swin V1), whose backward recomputes the attention per chunk of an image's windows from
q, k, v, bias and mask (``window_products.py``), so that chunk stays in the CPU's caches. Under
torch.export, the explicit path.

Precision: the bias, the masks and their sum stay float32 (the CPU flash kernel takes a float32
mask next to bf16 q, k, v; the generic path casts the summed mask to the kernels' dtype only at
the call), and the softmax statistics are float32 in every path (inside the SDPA kernels; the
explicit path adds the float32 bias before its softmax, which promotes the logits).

Imports torch only.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..compat import (SDPA_TAKES_FLOAT_MASK, TRACED_SDPA_EXPORTS, WeakIdKeyDictionary,
                      custom_op, is_exporting)
from .continuous_position import scaled_cosine_query_key
from .dispatch import (autocast_context, choose_kernel, compute_dtype, is_tracing,
                       use_cpu_fast_paths)
from .window_products import (attention_backward_op, attention_qkv_backward_op,
                              explicit_per_image, qkv_views, underflowing_mask)

__all__ = ['window_attention', 'window_attention_qkv', 'generic_window_attention', 'split_qkv',
           'every_window']


class _SplitQKV(torch.autograd.Function):
    """q, k, v as views of the qkv projection; backward writes their gradients straight into
    one gradient of the projection's layout (autograd's unbind + permute + reshape would stack
    them, then copy the stack into that layout: two passes of 3C instead of one)."""

    @staticmethod
    def forward(ctx, qkv: Tensor, heads: int):
        bw, n, c3 = qkv.shape
        return qkv.view(bw, n, 3, heads, c3 // 3 // heads).permute(2, 0, 3, 1, 4).unbind(0)

    @staticmethod
    def backward(ctx, dq: Tensor, dk: Tensor, dv: Tensor):
        bw, heads, n, head_dim = next(g for g in (dq, dk, dv) if g is not None).shape
        like = next(g for g in (dq, dk, dv) if g is not None)
        grad = like.new_empty(bw, n, 3, heads, head_dim)
        for i, g in enumerate((dq, dk, dv)):
            if g is None:
                grad[:, :, i].zero_()
            else:
                grad[:, :, i].copy_(g.transpose(1, 2))
        return grad.view(bw, n, 3 * heads * head_dim), None


def split_qkv(qkv: Tensor, heads: int) -> Tuple[Tensor, Tensor, Tensor]:
    """[B * nW, N, 3C] -> q, k, v [B * nW, heads, N, C / heads], views of qkv."""
    # is_contiguous last: dynamo on torch 2.1 breaks its graph there
    if torch.is_grad_enabled() and qkv.requires_grad and not is_tracing(qkv) \
            and qkv.is_contiguous():
        return _SplitQKV.apply(qkv, heads)
    bw, n, c3 = qkv.shape
    return qkv.reshape(bw, n, 3, heads, c3 // 3 // heads).permute(2, 0, 3, 1, 4).unbind(0)


def window_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor,
                     mask: Optional[Tensor] = None, scale: Optional[float] = None,
                     dropout_p: float = 0.0, fused: bool = True,
                     windows_per_image: Optional[int] = None) -> Tensor:
    """softmax(q k^T * scale + bias + mask) v over the windows of a batch.

    Args:
        q, k, v: [B * nW, heads, N, head_dim], windows batch-major.
        bias: [heads, N, N] relative position bias, the same for every window.
        mask: [nM, N, N] additive mask of the LAST nM windows of each image (the others are
            unmasked), [B, nM, N, N] for one mask per image, or None. With windows_per_image
            None, nM = nW: every window masked.
        scale: logit scale; head_dim ** -0.5 if None.
        dropout_p: attention dropout probability (pass 0 in eval mode).
        fused: ``F.scaled_dot_product_attention``; otherwise explicit matmul + softmax in the
            operation order of the reference code (q scaled before q @ k^T).
        windows_per_image: nW; defaults to mask.shape[0].

    Returns:
        [B * nW, N, heads * head_dim], the layout the output projection takes.
    """
    bw, heads, n, head_dim = q.shape
    scale = head_dim ** -0.5 if scale is None else scale
    if windows_per_image is not None:
        nw = windows_per_image
    else:
        nw = q.shape[0] if mask is None else mask.shape[-3]
    if not is_tracing(q):  # sizes are symbolic under tracers: no checks that branch on them
        _check_shapes(q.shape, bias, mask, nw)
    # torch.export takes the explicit path: it is what ONNX runs anyway (MatMul, Softmax), and
    # its SDPA decomposition (torch 2.13) gives outputs whose strides do not match their
    # symbolic sizes, so a later reshape fails to decompose.
    if not fused or is_exporting() or (torch.jit.is_tracing() and not TRACED_SDPA_EXPORTS):
        return _explicit(q, k, v, bias, mask, scale, dropout_p, nw)
    if not use_cpu_fast_paths(q):
        return generic_window_attention(q, k, v, bias, mask, scale, dropout_p, nw)
    # The CPU kernels below are called with autocast off (it would cast the float32 mask), so
    # q, k and v are cast to autocast's dtype here.
    dtype = compute_dtype(q)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    with torch.autocast('cpu', enabled=False):
        return _cpu_fused(q, k, v, bias, mask, scale, dropout_p, nw)


def window_attention_qkv(qkv: Tensor, heads: int, bias: Tensor, mask: Optional[Tensor] = None,
                         scale: Optional[float] = None, dropout_p: float = 0.0,
                         fused: bool = True, windows_per_image: Optional[int] = None,
                         logit_scale: Optional[Tensor] = None) -> Tensor:
    """:func:`window_attention` of the q, k, v of one qkv projection output, [B * nW, N, 3C]
    (q, k, v the projection's own columns), the other arguments as there. ``logit_scale``
    ([heads, 1, 1]): SwinV2's cosine attention (``scaled_cosine_query_key``), q and k
    normalised and q scaled; ``scale`` is then 1.

    On the CPU path without dropout or cosine it is one registered op on the packed tensor,
    whose backward writes the gradient of qkv in qkv's layout: no gradient of q, k and v apart
    for autograd to copy into it. Anywhere else it is :func:`window_attention` of
    :func:`split_qkv`'s views.
    """
    cpu_path = use_cpu_fast_paths(qkv)
    if (not fused or dropout_p > 0 or logit_scale is not None or not cpu_path
            or torch.jit.is_tracing() or is_exporting() or not qkv.is_contiguous()):
        q, k, v = split_qkv(qkv, heads)
        if logit_scale is not None:
            (q, k), scale = scaled_cosine_query_key(q, k, logit_scale), 1.0
        return window_attention(q, k, v, bias, mask, scale, dropout_p, fused, windows_per_image)
    bw, n, c3 = qkv.shape
    head_dim = c3 // 3 // heads
    scale = head_dim ** -0.5 if scale is None else scale
    nw = windows_per_image if windows_per_image is not None else \
        (bw if mask is None else mask.shape[-3])
    if not is_tracing(qkv):
        if c3 != 3 * heads * head_dim:
            raise ValueError(f'qkv has {c3} channels, not 3 x {heads} heads x a head size')
        _check_shapes((bw, heads, n, head_dim), bias, mask, nw)
    # Autocast off around the op, as in window_attention: qkv is cast to its dtype here.
    qkv = qkv.to(compute_dtype(qkv))
    with autocast_context(qkv.device.type):
        return _attention_qkv_op(qkv, heads, bias, mask, scale, nw)


def _check_shapes(q_shape, bias: Tensor, mask: Optional[Tensor], nw: int) -> None:
    bw, heads, n, _ = q_shape
    if bias.shape != (heads, n, n):
        raise ValueError(f'bias must be [heads={heads}, N={n}, N={n}], got {tuple(bias.shape)}')
    if mask is not None and (bw % nw or mask.shape[-3] > nw or mask.shape[-2:] != (n, n)
                             or (mask.dim() == 4 and mask.shape[0] != bw // nw)):
        raise ValueError(f'mask of shape {tuple(mask.shape)} does not fit {bw} windows of '
                         f'{n} tokens, {nw} per image')


def generic_window_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor,
                             mask: Optional[Tensor], scale: float, dropout_p: float, nw: int,
                             dtype: Optional[torch.dtype] = None,
                             tracing: Optional[bool] = None) -> Tensor:
    """The path of every device but the CPU fast paths' (dispatch.py): one SDPA call for all
    windows of all images, autograd through SDPA's own backward (each device's fused kernels).

    q, k, v [B * nW, heads, N, d] as they are (views of the qkv projection, for Swin V1); the
    bias [1, heads, N, N] broadcast over every window, or with a shift mask, bias + mask made
    once per window ([1 or B, nW, heads, N, N], the mask of every window made once per plan:
    :func:`every_window`) and expanded over the images: one copy, which measured leaner than
    folding the windows into the heads (that copies q, k, v and the output instead; tables
    frozen, Swin-T 512x512 b2 fp32, allocator peak 0.648x of mmdet's against 0.654x). The
    float32 sum is cast to the products' dtype at the call (``dtype``, if the caller knows it;
    ``tracing`` likewise: :func:`every_window`'s). No loop, no branch on sizes: eager, tracers
    and compilers run the same ops."""
    bw, heads, n, head_dim = q.shape
    if dtype is None:
        dtype = compute_dtype(q)
    if mask is None:
        attn_mask = bias.unsqueeze(0).to(dtype)
    else:
        attn_mask = (every_window(mask, nw, q, tracing).unsqueeze(2) + bias).to(dtype)
        attn_mask = attn_mask.expand(bw // nw, nw, heads, n, n).reshape(bw, heads, n, n)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                         scale=scale)
    return out.transpose(1, 2).reshape(bw, n, heads * head_dim)


def every_window(mask: Tensor, nw: int, like: Tensor, tracing: Optional[bool] = None) -> Tensor:
    """[B or 1, nW, N, N] from a mask of the last nM windows ([nM, N, N] or [B, nM, N, N]).

    Unmasked windows come first in plan order: zeros in front of the nM masks, made once
    per mask in eager mode (plans are cached, so once per plan); under tracers padded by 0 in
    the graph (traceable plans mask every window: no branch on sizes)."""
    full = mask if mask.dim() == 4 else mask.unsqueeze(0)
    if is_tracing(like) if tracing is None else tracing:
        return F.pad(full, (0, 0, 0, 0, nw - full.shape[1], 0))
    if full.shape[1] == nw:
        return full
    version = None if mask.is_inference() else mask._version
    cached = _EVERY_WINDOW.get(mask)
    if cached is not None and version is not None and cached[0] == (version, nw):
        return cached[1]
    full = F.pad(full, (0, 0, 0, 0, nw - full.shape[1], 0))
    if version is not None:
        _EVERY_WINDOW[mask] = ((version, nw), full)
    return full


_EVERY_WINDOW = WeakIdKeyDictionary()  # mask -> ((its version, nW), the mask of every window)


def _cpu_fused(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Optional[Tensor],
               scale: float, dropout_p: float, nw: int) -> Tensor:
    if dropout_p == 0 and not torch.jit.is_tracing():
        # SDPA's CPU flash kernel has no gradient for the mask, so autograd would fall back
        # to the math path, which keeps every attention matrix for the backward. The op runs
        # the flash forward and recomputes the attention matrices a chunk at a time backward;
        # registered, so torch.compile calls it as it is.
        return _attention_op(q, k, v, bias, mask, scale, nw)
    return _fused(q, k, v, bias, mask, scale, dropout_p, nw)


def _fused(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Optional[Tensor], scale: float,
           dropout_p: float, nw: int) -> Tensor:
    bw, heads, n, head_dim = q.shape
    # The CPU flash kernel of SDPA takes 4-D inputs and a 4-D mask that broadcasts over the
    # batch ([1, heads, N, N]) or matches it; other shapes fall back to the slower math path.
    # So unmasked windows run in one call with the broadcast bias, and the masked windows of
    # each image in one call with their [nM, heads, N, N] bias + mask: the combined mask is
    # never materialised for every window of every image.
    mask_dtype = _mask_dtype(q)
    if mask is None:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.unsqueeze(0).to(mask_dtype),
                                             dropout_p=dropout_p, scale=scale)
        return out.transpose(1, 2).reshape(bw, n, heads * head_dim)
    nm = mask.shape[-3]
    plain_bias = bias.unsqueeze(0).to(mask_dtype)
    masked_bias = None if mask.dim() == 4 else _masked_bias(bias, mask, mask_dtype)
    parts = []
    for image, start in enumerate(range(0, bw, nw)):
        if mask.dim() == 4:
            masked_bias = _masked_bias(bias, mask[image], mask_dtype)
        cut = start + nw - nm
        for lo, hi, attn_mask in ((start, cut, plain_bias), (cut, start + nw, masked_bias)):
            if hi > lo:
                parts.append(F.scaled_dot_product_attention(
                    q[lo:hi], k[lo:hi], v[lo:hi], attn_mask=attn_mask, dropout_p=dropout_p,
                    scale=scale).transpose(1, 2))
    return torch.cat(parts).reshape(bw, n, heads * head_dim)


def _mask_dtype(q: Tensor) -> torch.dtype:
    """float32 next to bf16/fp16 queries (the CPU flash kernel takes it), else q's dtype."""
    if q.dtype not in (torch.bfloat16, torch.float16) or not SDPA_TAKES_FLOAT_MASK:
        return q.dtype
    return torch.float32


def _masked_bias(bias: Tensor, mask: Tensor, dtype: torch.dtype) -> Tensor:
    """[nM, heads, N, N] bias + mask of the masked windows of one image, summed in the wider
    of their dtypes (float32) and cast to the kernels' ``dtype`` after the sum."""
    return (bias.unsqueeze(0) + underflowing_mask(mask).unsqueeze(1)).to(dtype)


def _explicit(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Optional[Tensor],
              scale: float, dropout_p: float, nw: int) -> Tensor:
    bw, heads, n, head_dim = q.shape
    attn = (q * scale) @ k.transpose(-2, -1) + bias
    if mask is not None:  # [B, nW, heads, N, N] + [B or 1, nW, 1, N, N]
        full = every_window(mask, nw, q).unsqueeze(2).to(attn.dtype)
        attn = (attn.view(bw // nw, nw, heads, n, n) + full).view(bw, heads, n, n)
    attn = attn.softmax(dim=-1)
    if dropout_p > 0:
        attn = F.dropout(attn, p=dropout_p)
    return (attn @ v).transpose(1, 2).reshape(bw, n, heads * head_dim)


@custom_op('swin_rpe::window_attention', mutates_args=())
def _attention_op(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Optional[Tensor],
                  scale: float, nw: int) -> Tensor:
    """The CPU path's attention: forward :func:`_fused` (no dropout), or where the kernel rule
    names 'explicit' for q's dtype (``dispatch.choose_kernel('attention', ...)``),
    :func:`explicit_per_image`; backward :func:`attention_backward_op`."""
    # The registered backward gives the gradients, so the kernels get detached inputs: a view
    # of the bias parameter still requires grad inside the op, and SDPA then leaves every
    # kernel but its math path (which materialises each attention matrix) for the unmasked
    # windows' broadcast bias, in training on every device.
    return _attention_forward(q.detach(), k.detach(), v.detach(), bias.detach(), mask, scale,
                              nw)


def _attention_forward(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Optional[Tensor],
                       scale: float, nw: int) -> Tensor:
    if choose_kernel('attention', q.device.type, q.dtype) == 'explicit':
        return explicit_per_image(q, k, v, bias, mask, scale, nw)
    return _fused(q, k, v, bias, mask, scale, 0.0, nw)


@_attention_op.register_fake
def _(q, k, v, bias, mask, scale, nw):
    bw, heads, n, head_dim = q.shape
    return q.new_empty((bw, n, heads * head_dim))


def _attention_setup(ctx, inputs, output) -> None:
    q, k, v, bias, mask, scale, nw = inputs[:7]
    ctx.save_for_backward(q, k, v, bias, mask)
    ctx.scale, ctx.nw = scale, nw


def _attention_backward(ctx, grad_out: Tensor):
    q, k, v, bias, mask = ctx.saved_tensors
    dq, dk, dv, dbias = attention_backward_op(grad_out.contiguous(), q, k, v, bias, mask,
                                               ctx.scale, ctx.nw)
    return dq, dk, dv, dbias, None, None, None


_attention_op.register_autograd(_attention_backward, setup_context=_attention_setup)


@custom_op('swin_rpe::window_attention_qkv', mutates_args=())
def _attention_qkv_op(qkv: Tensor, heads: int, bias: Tensor, mask: Optional[Tensor],
                      scale: float, nw: int) -> Tensor:
    """:func:`_attention_op` of the q, k, v packed in one qkv projection output [B * nW, N,
    3C] (dense); its backward (:func:`attention_qkv_backward_op`) writes the gradient of qkv
    in that layout, where the attention on q, k, v views leaves three gradients for autograd
    to copy into it (``_SplitQKV``)."""
    return _attention_forward(*qkv_views(qkv.detach(), heads), bias.detach(), mask, scale,
                              nw)


@_attention_qkv_op.register_fake
def _(qkv, heads, bias, mask, scale, nw):
    bw, n, c3 = qkv.shape
    return qkv.new_empty((bw, n, c3 // 3))


def _attention_qkv_setup(ctx, inputs, output) -> None:
    qkv, heads, bias, mask, scale, nw = inputs[:6]
    ctx.save_for_backward(qkv, bias, mask)
    ctx.heads, ctx.scale, ctx.nw = heads, scale, nw


def _attention_qkv_backward(ctx, grad_out: Tensor):
    qkv, bias, mask = ctx.saved_tensors
    dqkv, dbias = attention_qkv_backward_op(grad_out.contiguous(), qkv, ctx.heads, bias, mask,
                                             ctx.scale, ctx.nw)
    return dqkv, None, dbias, None, None, None


_attention_qkv_op.register_autograd(_attention_qkv_backward, setup_context=_attention_qkv_setup)
