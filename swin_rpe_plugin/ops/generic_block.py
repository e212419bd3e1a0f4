"""One Swin block as a GPU runs it: the generic path of a block, top to bottom, in one place.

    attention_half:
    x  -> norm1 -> window gather -> qkv   ..... _NormWindowsQKV (one autograd Function)
       -> SDPA(q, k, v, bias (+ shift mask)) .. SDPA's own autograd (the device's fused kernels)
       -> proj (window order) -> gather back to map order -> x + drop_path(.)    plain autograd
    ffn_half:
    x2 -> norm2 -> fc1 -> GELU -> fc2 -> x2 + drop_path(.) ..... _NormMLP (one autograd Function)

and between stages, :func:`patch_merge` (2x2 neighbourhoods -> norm -> reduction,
_MergeNormReduce).

At detection sizes a GPU step is bound by its host, so this path is written for the host's work
per step: two autograd Functions per block, whose backwards are straight sequences of native
ops (no nested autograd pass, no Python callback), no cast, reshape or detach that changes
nothing, and facts (dtype, drop path) read once per block. Memory stays lean: the Functions
keep their inputs and recompute the norms, the window gather and GELU in backward (the GEMMs
are never recomputed); q, k and v are views of the qkv projection in every block, and the
output projection runs in window order, so it keeps SDPA's output, which SDPA keeps anyway.
Shifted blocks add the shift mask to the bias once per window ([nW, heads, N, N]) and expand
it over the images (one copy, which measured leaner than folding the windows into the heads:
that copies q, k, v and the output instead; tables frozen, Swin-T 512x512 b2 fp32, allocator
peak 0.648x of mmdet's against 0.654x).

Under autocast the products run in autocast's dtype (F.linear casts in forward; the backwards,
which run outside autocast, cast the weights again instead of keeping their casts), the norms
and the residual stream stay in the input's dtype, as in mmdet's Swin. Drop path is mmcv's
(the same random draw per image, in the same order: attention branch, then FFN branch).

Eligibility (LayerNorm norms, exact GELU, no dropout, eager mode: tracers, exporters and
compilers see the modules' plain ops) is the caller's: ``models/layers.SwinBlock``. Imports
torch only.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..compat import apply_function, gelu_backward_
from .attention import every_window
from .dispatch import compute_dtype
from .windows import _gather

__all__ = ['attention_half', 'ffn_half', 'patch_merge', 'drop_path_keep']

_layer_norm = torch.native_layer_norm
_layer_norm_backward = torch.ops.aten.native_layer_norm_backward
_gelu_ = torch.ops.aten.gelu_


def drop_path_keep(batch: int, drop_prob: float, dtype: torch.dtype, device) -> Tensor:
    """[B, 1, 1] per-image scale of mmcv's ``DropPath`` (0 or 1 / keep_prob), drawn as mmcv
    draws it (``keep_prob + rand([B, 1, 1])`` in the branch's dtype, floored), so the random
    stream and the dropped images are mmcv's."""
    keep_prob = 1 - drop_prob
    keep = torch.rand((batch, 1, 1), dtype=dtype, device=device)
    return keep.add_(keep_prob).floor_().div_(keep_prob)


class _NormWindowsQKV(torch.autograd.Function):
    """``linear(gather(layer_norm(x)), weight, bias)``: keeps x and the norm's statistics, and
    recomputes the norm and the gather in backward."""

    @staticmethod
    def forward(ctx, x: Tensor, norm_weight: Tensor, norm_bias: Tensor, eps: float,
                index: Tensor, zeros, scatter: Tensor, weight: Tensor,
                bias: Optional[Tensor]) -> Tensor:
        shape = x.shape[-1:]
        y, mean, rstd = _layer_norm(x, shape, norm_weight, norm_bias, eps)
        qkv = F.linear(_gather(y, index, zeros), weight, bias)
        ctx.save_for_backward(x, mean, rstd, norm_weight, norm_bias, weight, index, scatter)
        ctx.eps, ctx.zeros, ctx.has_bias = eps, zeros, bias is not None
        return qkv

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, mean, rstd, norm_weight, norm_bias, weight, index, scatter = ctx.saved_tensors
        dtype, shape = grad.dtype, x.shape[-1:]
        c = shape[0]
        windows = _gather(_layer_norm(x, shape, norm_weight, norm_bias, ctx.eps)[0], index,
                          ctx.zeros)
        if windows.dtype != dtype:
            windows = windows.to(dtype)
        grad = grad.reshape(-1, grad.shape[-1])
        grad_weight = grad.t().mm(windows.view(-1, c))
        grad_bias = grad.sum(0, dtype=weight.dtype) if ctx.has_bias else None
        grad_windows = grad.mm(weight if weight.dtype == dtype else weight.to(dtype))
        grad_y = _gather(grad_windows.view(x.shape[0], -1, c), scatter, False)
        if grad_y.dtype != x.dtype:
            grad_y = grad_y.to(x.dtype)
        needs = ctx.needs_input_grad
        grad_x, grad_norm_weight, grad_norm_bias = _layer_norm_backward(
            grad_y, x, shape, mean, rstd, norm_weight, norm_bias, [needs[0], needs[1], needs[2]])
        if grad_weight.dtype != weight.dtype:
            grad_weight = grad_weight.to(weight.dtype)
        return (grad_x, grad_norm_weight, grad_norm_bias, None, None, None, None, grad_weight,
                grad_bias)


class _NormMLP(torch.autograd.Function):
    """``x + keep * fc2(gelu(fc1(layer_norm(x))))``: keeps x, the norm's statistics and fc1's
    output; recomputes the norm and GELU in backward, GELU's gradient written in place."""

    @staticmethod
    def forward(ctx, x: Tensor, norm_weight: Tensor, norm_bias: Tensor, eps: float,
                fc1_weight: Tensor, fc1_bias: Tensor, fc2_weight: Tensor, fc2_bias: Tensor,
                keep: Optional[Tensor]) -> Tensor:
        shape = x.shape[-1:]
        y, mean, rstd = _layer_norm(x, shape, norm_weight, norm_bias, eps)
        hidden = F.linear(y, fc1_weight, fc1_bias)
        out = F.linear(F.gelu(hidden), fc2_weight, fc2_bias)
        ctx.save_for_backward(x, mean, rstd, norm_weight, norm_bias, fc1_weight, fc2_weight,
                              hidden, keep)
        ctx.eps = eps
        return x + out if keep is None else torch.addcmul(x, out, keep)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (x, mean, rstd, norm_weight, norm_bias, fc1_weight, fc2_weight, hidden,
         keep) = ctx.saved_tensors
        dtype, shape = hidden.dtype, x.shape[-1:]
        g = grad if keep is None else grad * keep
        if g.dtype != dtype:
            g = g.to(dtype)
        g = g.reshape(-1, shape[0])
        hidden = hidden.view(-1, hidden.shape[-1])
        grad_fc2_weight = g.t().mm(F.gelu(hidden))
        grad_fc2_bias = g.sum(0, dtype=fc2_weight.dtype)
        grad_hidden = gelu_backward_(g.mm(fc2_weight if fc2_weight.dtype == dtype
                                          else fc2_weight.to(dtype)), hidden)
        y = _layer_norm(x, shape, norm_weight, norm_bias, ctx.eps)[0]
        if y.dtype != dtype:
            y = y.to(dtype)
        grad_fc1_weight = grad_hidden.t().mm(y.view(-1, shape[0]))
        grad_fc1_bias = grad_hidden.sum(0, dtype=fc1_weight.dtype)
        grad_y = grad_hidden.mm(fc1_weight if fc1_weight.dtype == dtype
                                else fc1_weight.to(dtype)).view(x.shape)
        if grad_y.dtype != x.dtype:
            grad_y = grad_y.to(x.dtype)
        needs = ctx.needs_input_grad
        grad_x, grad_norm_weight, grad_norm_bias = _layer_norm_backward(
            grad_y, x, shape, mean, rstd, norm_weight, norm_bias, [True, needs[1], needs[2]])
        if grad_fc1_weight.dtype != fc1_weight.dtype:
            grad_fc1_weight = grad_fc1_weight.to(fc1_weight.dtype)
            grad_fc2_weight = grad_fc2_weight.to(fc2_weight.dtype)
        return (grad_x.add_(grad), grad_norm_weight, grad_norm_bias, None, grad_fc1_weight,
                grad_fc1_bias, grad_fc2_weight, grad_fc2_bias, None)


# Inference: the same computations without autograd, each intermediate let go as soon as the
# next is made, GELU in place (no second tensor of 4 channel-widths) and the residual added
# into the branch's output where their dtypes agree.

def _norm_windows_qkv(x, norm_weight, norm_bias, eps, index, zeros, scatter, weight, bias):
    return F.linear(_gather(_layer_norm(x, x.shape[-1:], norm_weight, norm_bias, eps)[0],
                            index, zeros), weight, bias)


def _norm_mlp(x, norm_weight, norm_bias, eps, fc1_weight, fc1_bias, fc2_weight, fc2_bias,
              keep):
    out = F.linear(_layer_norm(x, x.shape[-1:], norm_weight, norm_bias, eps)[0], fc1_weight,
                   fc1_bias)
    out = F.linear(_gelu_(out), fc2_weight, fc2_bias)
    return _add_residual(x, out) if keep is None else torch.addcmul(x, out, keep)


def _add_residual(x: Tensor, out: Tensor) -> Tensor:
    return out.add_(x) if out.dtype == x.dtype else x + out


def attention_half(x: Tensor, plan, heads: int, scale: float, bias: Tensor,
                   norm1: Tuple[Tensor, Tensor, float], qkv: Tuple[Tensor, Optional[Tensor]],
                   proj: Tuple[Tensor, Tensor], drop_prob: float = 0.,
                   mask_bias: Optional[Tensor] = None) -> Tensor:
    """``x + drop_path(proj(attention(windows(norm1(x)))))``: [B, H*W, C] -> [B, H*W, C].

    Args:
        plan: the block's window plan (``ops/plan.py``: gather, scatter, shift mask).
        heads, scale: attention heads and logit scale.
        bias: [heads, N, N] relative position bias (float32).
        norm1: (weight, bias, eps) of the LayerNorm; qkv, proj: (weight, bias) of the linears.
        drop_prob: the probability that drop path drops an image's branch (mmcv's DropPath in
            training: :func:`drop_path_keep`; 0 in eval mode).
        mask_bias: bias + the shift mask of every window, [1 or B, nW * heads, N, N], in the
            products' dtype, if the caller has it (shifted blocks; made here otherwise).
    """
    b, length, c = x.shape
    index, zeros = plan.window_index()
    n = index.shape[0] // plan.num_windows
    nw, d = plan.num_windows, c // heads
    grad = torch.is_grad_enabled()
    if grad:
        qkv_out = apply_function(_NormWindowsQKV, x, *norm1, index, zeros, plan.scatter, *qkv)
    else:
        qkv_out = _norm_windows_qkv(x, *norm1, index, zeros, plan.scatter, *qkv)
    # q, k, v: views of the projection
    q, k, v = qkv_out.view(b * nw, n, 3, heads, d).permute(2, 0, 3, 1, 4).unbind(0)
    if plan.mask is None:  # the bias broadcast
        attn_mask = bias.unsqueeze(0).to(q.dtype)
    else:  # bias + mask per window, broadcast over the images
        if mask_bias is None:
            mask_bias = window_mask_bias(plan, bias, nw, qkv_out.dtype)
        attn_mask = mask_bias.expand(b, nw, heads, n, n).reshape(b * nw, heads, n, n)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)
    out = out.transpose(1, 2).reshape(b * nw, n, c)
    # The projection in window order (it keeps SDPA's output), then back to map order.
    out = _gather(F.linear(out, *proj).view(b, -1, c), plan.scatter, False)
    if drop_prob:
        return torch.addcmul(x, out, drop_path_keep(b, drop_prob, out.dtype, x.device))
    return x + out if grad else _add_residual(x, out)


def ffn_half(x: Tensor, norm2: Tuple[Tensor, Tensor, float], fc1: Tuple[Tensor, Tensor],
             fc2: Tuple[Tensor, Tensor], drop_prob: float = 0.) -> Tensor:
    """``x + drop_path(fc2(gelu(fc1(norm2(x)))))``: [B, H*W, C] -> [B, H*W, C]; the arguments
    as :func:`attention_half`'s."""
    keep = drop_path_keep(x.shape[0], drop_prob, compute_dtype(x), x.device) \
        if drop_prob else None
    if torch.is_grad_enabled():
        return apply_function(_NormMLP, x, *norm2, *fc1, *fc2, keep)
    return _norm_mlp(x, *norm2, *fc1, *fc2, keep)


def window_mask_bias(plan, bias: Tensor, nw: int, dtype: torch.dtype) -> Tensor:
    """[1 or B, nW, heads, N, N]: the bias plus the shift mask of each window, in ``dtype``
    (the mask of every window made once per plan: ``attention.every_window``)."""
    mask = every_window(plan.mask, nw, bias, tracing=False)
    out = mask.unsqueeze(2) + bias
    return out if out.dtype == dtype else out.to(dtype)


def _neighbourhoods(x: Tensor, h: int, w: int) -> Tensor:
    """[B, H*W, C] -> [B, ceil(H/2) * ceil(W/2), 4C]: each 2x2 neighbourhood concatenated in
    ``nn.Unfold``'s channel order (c, ky, kx), zero-padded at the bottom/right."""
    b, _, c = x.shape
    x = x.view(b, h, w, c)
    if h % 2 or w % 2:
        x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
    hh, ww = (h + 1) // 2, (w + 1) // 2
    return x.view(b, hh, 2, ww, 2, c).permute(0, 1, 3, 5, 2, 4).reshape(b, hh * ww, 4 * c)


class _MergeNormReduce(torch.autograd.Function):
    """``linear(layer_norm(neighbourhoods(x)), weight)``, the patch merging of a stage: keeps
    x (the stage output, which the output norm keeps anyway) and the norm's statistics, and
    recomputes the neighbourhoods and the norm in backward."""

    @staticmethod
    def forward(ctx, x: Tensor, h: int, w: int, norm_weight: Tensor, norm_bias: Tensor,
                eps: float, weight: Tensor) -> Tensor:
        t = _neighbourhoods(x, h, w)
        y, mean, rstd = _layer_norm(t, t.shape[-1:], norm_weight, norm_bias, eps)
        ctx.save_for_backward(x, mean, rstd, norm_weight, norm_bias, weight)
        ctx.hw, ctx.eps = (h, w), eps
        return F.linear(y, weight)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, mean, rstd, norm_weight, norm_bias, weight = ctx.saved_tensors
        (h, w), dtype = ctx.hw, grad.dtype
        t = _neighbourhoods(x, h, w)
        b, length, c4 = t.shape
        y = _layer_norm(t, t.shape[-1:], norm_weight, norm_bias, ctx.eps)[0]
        if y.dtype != dtype:
            y = y.to(dtype)
        grad = grad.reshape(-1, grad.shape[-1])
        grad_weight = grad.t().mm(y.view(-1, c4))
        grad_y = grad.mm(weight if weight.dtype == dtype else weight.to(dtype)).view(t.shape)
        if grad_y.dtype != t.dtype:
            grad_y = grad_y.to(t.dtype)
        needs = ctx.needs_input_grad
        grad_t, grad_norm_weight, grad_norm_bias = _layer_norm_backward(
            grad_y, t, t.shape[-1:], mean, rstd, norm_weight, norm_bias,
            [needs[0], needs[3], needs[4]])
        grad_x = None
        if grad_t is not None:  # the neighbourhoods' gradient back in map order, cropped
            c, hh, ww = c4 // 4, (h + 1) // 2, (w + 1) // 2
            grad_x = grad_t.view(b, hh, ww, c, 2, 2).permute(0, 1, 4, 2, 5, 3).reshape(
                b, 2 * hh, 2 * ww, c)
            if h % 2 or w % 2:
                grad_x = grad_x[:, :h, :w]
            grad_x = grad_x.reshape(b, h * w, c)
        if grad_weight.dtype != weight.dtype:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_x, None, None, grad_norm_weight, grad_norm_bias, None, grad_weight


def patch_merge(x: Tensor, hw: Tuple[int, int], norm: Tuple[Tensor, Tensor, float],
                weight: Tensor) -> Tensor:
    """A stride-2 patch merging on the generic path: [B, H*W, C] -> [B, H'*W', C_out], each
    2x2 neighbourhood concatenated, normalised (LayerNorm ``norm``: weight, bias, eps) and
    reduced by ``weight`` [C_out, 4C] (no bias)."""
    if torch.is_grad_enabled():
        return apply_function(_MergeNormReduce, x, hw[0], hw[1], *norm, weight)
    t = _neighbourhoods(x, hw[0], hw[1])
    return F.linear(_layer_norm(t, t.shape[-1:], *norm)[0], weight)
