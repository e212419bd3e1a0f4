"""One Swin block (V1 and SwinV2), written once: its numerics here, its kernels a choice inside.

    attention_half:
    x  -> norm1 -> window gather -> qkv   ..... _NormWindowsQKV (one autograd Function)
       -> attention(q, k, v, bias (+ shift mask)) ............. the kernels' (see below)
       -> proj -> back to map order -> x + drop_path(.)
    ffn_half:
    x2 -> norm2 -> fc1 -> GELU -> fc2 -> x2 + drop_path(.) ..... _NormMLP (one autograd Function)

and between stages, :func:`patch_merge` (2x2 neighbourhoods -> norm -> reduction,
_MergeNormReduce). SwinV2 is the same halves with ``post_norm`` (no norm before the Functions;
the norm on the branch, before drop path and the residual), cosine attention (``logit_scale``,
inside the kernels' attention) and its continuous position bias as ``bias``; its patch merging
norms after the reduction (the module's norm after :func:`patch_merge` without one). Dropout
(attention, projection, FFN) is drawn where and in the order the modules draw it.

The kernels (:class:`BlockKernels`) are chosen once per backbone forward by
``dispatch.block_kernels``, as SDPA chooses its backend inside one call:

- :data:`GENERIC` (every device; the CPU under ``SWIN_RPE_BACKEND=generic``): ``F.linear``, one
  ``F.scaled_dot_product_attention`` call per layer for all windows of all images (each device's
  fused kernels, SDPA's own autograd; ``attention.generic_window_attention``), the output projection
  in window order (it keeps SDPA's output, which SDPA keeps anyway), then the gather back and the
  residual add.
- :data:`CPU`: the products by ``dispatch.KERNEL_RULES`` (oneDNN or MKL, ``ops/linear.py``),
  the residual added by the product itself, and the window attention op of
  ``ops/attention.py`` (unmasked and masked windows apart, the backward recomputed a chunk of
  windows at a time, which keeps no attention matrix): its output goes back to map order
  first, and the projection keeps it.

At detection sizes a GPU step is bound by its host, so the block is written for the host's work
per step: two autograd Functions per block, whose backwards are straight sequences of native
ops (no nested autograd pass, no Python callback), no cast, reshape or detach that changes
nothing, and facts (dtype, drop path) read once per block. Memory stays lean: the Functions
keep their inputs and recompute the norms, the window gather and GELU in backward (the GEMMs
are never recomputed); q, k and v are views of the qkv projection in every block. With FFN
dropout the FFN runs in stock autograd (its Function would have to keep the dropout masks).

Under autocast the products run in autocast's dtype (F.linear casts in forward, the CPU's
kernels cast as it would; the backwards, which run outside autocast, cast the weights again
instead of keeping their casts), the norms
and the residual stream stay in the input's dtype, as in mmdet's Swin. Drop path is mmcv's
(the same random draw per image, in the same order: attention branch, then FFN branch).

Eligibility (LayerNorm norms, exact GELU, the fused attention, eager mode: tracers, exporters
and compilers see the modules' plain ops) is the caller's: ``models/layers.SwinBlock``. Imports
torch only.
"""
from typing import Callable, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..compat import apply_function, gelu_backward_
from .attention import generic_window_attention, split_qkv, window_attention_qkv
from .continuous_position import scaled_cosine_query_key
from .dispatch import compute_dtype
from .linear import linear, linear_residual
from .recompute import linear_keeping_input
from .windows import _gather, gather_tokens

__all__ = ['BlockKernels', 'GENERIC', 'CPU', 'KERNELS', 'attention_half', 'ffn_half',
           'patch_merge', 'drop_path_keep']

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


# The Functions below are written for the host's work per call (each Python call is time a
# GPU waits for): casts and optional norms inline, no helper frames.


class _NormWindowsQKV(torch.autograd.Function):
    """``linear(gather(layer_norm(x)), weight, bias)`` (no norm where ``norm_weight`` is None):
    keeps x, and recomputes the norm (its statistics too) and the gather in backward."""

    @staticmethod
    def forward(ctx, x: Tensor, norm_weight: Optional[Tensor], norm_bias: Optional[Tensor],
                eps: float, index: Tensor, zeros, scatter: Tensor, weight: Tensor,
                bias: Optional[Tensor], kernels: 'BlockKernels') -> Tensor:
        y = x if norm_weight is None else _layer_norm(x, x.shape[-1:], norm_weight, norm_bias,
                                                      eps)[0]
        qkv = kernels.linear(_gather(y, index, zeros), weight, bias)
        ctx.save_for_backward(x, norm_weight, norm_bias, weight, index, scatter)
        ctx.eps, ctx.zeros, ctx.has_bias, ctx.kernels = eps, zeros, bias is not None, kernels
        return qkv

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, norm_weight, norm_bias, weight, index, scatter = ctx.saved_tensors
        dtype, shape, kernels = grad.dtype, x.shape[-1:], ctx.kernels
        y, mean, rstd = (x, None, None) if norm_weight is None else _layer_norm(
            x, shape, norm_weight, norm_bias, ctx.eps)
        windows = _gather(y, index, ctx.zeros)
        del y
        if windows.dtype != dtype:
            windows = windows.to(dtype)
        grad = grad.reshape(-1, grad.shape[-1])
        grad_weight = grad.t().mm(windows.view(-1, shape[0]))
        grad_bias = kernels.bias_grad(grad, 0, dtype=weight.dtype) if ctx.has_bias else None
        grad_y = _gather(kernels.grad_input(grad, weight if weight.dtype == dtype else weight.to(
            dtype)).view(x.shape[0], -1, shape[0]), scatter, False)
        if grad_y.dtype != x.dtype:
            grad_y = grad_y.to(x.dtype)
        needs = ctx.needs_input_grad
        grad_x, grad_norm_weight, grad_norm_bias = (grad_y, None, None) if norm_weight is None \
            else _layer_norm_backward(grad_y, x, shape, mean, rstd, norm_weight, norm_bias,
                                      [needs[0], needs[1], needs[2]])
        return (grad_x, grad_norm_weight, grad_norm_bias, None, None, None, None,
                grad_weight if grad_weight.dtype == weight.dtype else grad_weight.to(weight.dtype),
                grad_bias, None)


class _NormMLP(torch.autograd.Function):
    """``x + keep * fc2(gelu(fc1(layer_norm(x))))``, keep drop path's draw in the products'
    dtype; SwinV2's (``norm_weight`` None) the branch alone, ``fc2(gelu(fc1(x)))``, which the
    caller norms and adds. Keeps x and fc1's output; recomputes the norm (its statistics too)
    and GELU in backward, GELU's gradient written in place."""

    @staticmethod
    def forward(ctx, x: Tensor, norm_weight: Optional[Tensor], norm_bias: Optional[Tensor],
                eps: float, fc1_weight: Tensor, fc1_bias: Tensor, fc2_weight: Tensor,
                fc2_bias: Tensor, drop_prob: float, kernels: 'BlockKernels') -> Tensor:
        hidden = kernels.linear(x if norm_weight is None else _layer_norm(
            x, x.shape[-1:], norm_weight, norm_bias, eps)[0], fc1_weight, fc1_bias)
        keep = drop_path_keep(x.shape[0], drop_prob, hidden.dtype, x.device) \
            if drop_prob else None
        ctx.save_for_backward(x, norm_weight, norm_bias, fc1_weight, fc2_weight, hidden, keep)
        ctx.eps, ctx.kernels = eps, kernels
        if norm_weight is None:
            return kernels.linear(F.gelu(hidden), fc2_weight, fc2_bias)
        if keep is None:
            return kernels.linear_residual(F.gelu(hidden), fc2_weight, fc2_bias, x)
        return torch.addcmul(x, kernels.linear(F.gelu(hidden), fc2_weight, fc2_bias), keep)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, norm_weight, norm_bias, fc1_weight, fc2_weight, hidden, keep = ctx.saved_tensors
        dtype, shape, kernels = hidden.dtype, x.shape[-1:], ctx.kernels
        g = grad if keep is None else grad * keep
        if g.dtype != dtype:
            g = g.to(dtype)
        g = g.reshape(-1, shape[0])
        hidden = hidden.view(-1, hidden.shape[-1])
        grad_fc2_weight = g.t().mm(F.gelu(hidden))
        grad_fc2_bias = kernels.bias_grad(g, 0, dtype=fc2_weight.dtype)
        grad_hidden = gelu_backward_(kernels.grad_input(
            g, fc2_weight if fc2_weight.dtype == dtype else fc2_weight.to(dtype)), hidden)
        y, mean, rstd = (x, None, None) if norm_weight is None else _layer_norm(
            x, shape, norm_weight, norm_bias, ctx.eps)
        if y.dtype != dtype:
            y = y.to(dtype)
        grad_fc1_weight = grad_hidden.t().mm(y.view(-1, shape[0]))
        grad_fc1_bias = kernels.bias_grad(grad_hidden, 0, dtype=fc1_weight.dtype)
        grad_y = kernels.grad_input(grad_hidden, fc1_weight if fc1_weight.dtype == dtype
                                    else fc1_weight.to(dtype)).view(x.shape)
        if grad_y.dtype != x.dtype:
            grad_y = grad_y.to(x.dtype)
        if grad_fc1_weight.dtype != fc1_weight.dtype:
            grad_fc1_weight = grad_fc1_weight.to(fc1_weight.dtype)
            grad_fc2_weight = grad_fc2_weight.to(fc2_weight.dtype)
        if norm_weight is None:  # SwinV2's branch alone: no norm, no residual
            return (grad_y, None, None, None, grad_fc1_weight, grad_fc1_bias, grad_fc2_weight,
                    grad_fc2_bias, None, None)
        needs = ctx.needs_input_grad
        grad_x, grad_norm_weight, grad_norm_bias = _layer_norm_backward(
            grad_y, x, shape, mean, rstd, norm_weight, norm_bias, [True, needs[1], needs[2]])
        return (grad_x.add_(grad), grad_norm_weight, grad_norm_bias, None, grad_fc1_weight,
                grad_fc1_bias, grad_fc2_weight, grad_fc2_bias, None, None)


def _add_branch(x: Tensor, branch: Tensor, keep: Optional[Tensor],
                post_norm: Optional[tuple]) -> Tensor:
    """``x + keep * post_norm(branch)`` (``post_norm`` = (weight, bias, eps) or None, ``keep``
    drop path's draw or None), in stock autograd; into branch, which nothing else holds, at
    inference where their dtypes agree."""
    if post_norm is not None:
        branch = F.layer_norm(branch, branch.shape[-1:], *post_norm)
    if keep is not None:
        return torch.addcmul(x, branch, keep)
    if torch.is_grad_enabled() or branch.dtype != x.dtype:
        return x + branch
    return branch.add_(x)


def attention_half(x: Tensor, plan, heads: int, scale: float, bias: Tensor,
                   norm1: Tuple[Tensor, Tensor, float], qkv: Tuple[Tensor, Optional[Tensor]],
                   proj: Tuple[Tensor, Tensor], drop_prob: float = 0.,
                   kernels: Optional['BlockKernels'] = None, post_norm: bool = False,
                   logit_scale: Optional[Tensor] = None, attn_drop: float = 0.,
                   proj_drop: float = 0.) -> Tensor:
    """``x + drop_path(proj(attention(windows(norm1(x)))))``: [B, H*W, C] -> [B, H*W, C].

    Args:
        plan: the block's window plan (``ops/plan.py``: gather, scatter, shift mask).
        heads, scale: attention heads and logit scale.
        bias: [heads, N, N] relative position bias (float32).
        norm1: (weight, bias, eps) of the LayerNorm; qkv, proj: (weight, bias) of the linears.
        drop_prob: the probability that drop path drops an image's branch (mmcv's DropPath in
            training: :func:`drop_path_keep`; 0 in eval mode).
        kernels: :data:`GENERIC` (default) or :data:`CPU`.
        post_norm: SwinV2's res-post-norm, ``x + drop_path(norm1(proj(attention(windows(x)))))``.
        logit_scale: SwinV2's cosine attention ([heads, 1, 1], ``scaled_cosine_query_key``);
            ``scale`` is then unused.
        attn_drop, proj_drop: dropout on the attention probabilities and on the projection's
            output (training only; their probabilities, 0 for none).
    """
    kernels = kernels or GENERIC
    index, zeros = plan.window_index()
    pre = None if post_norm else norm1
    if torch.is_grad_enabled():
        qkv_out = apply_function(_NormWindowsQKV, x, *(pre or (None, None, 0.)), index, zeros,
                                 plan.scatter, *qkv, kernels)
    else:  # each intermediate let go as soon as the next is made
        qkv_out = kernels.linear(_gather(x if pre is None else _layer_norm(
            x, x.shape[-1:], *pre)[0], index, zeros), *qkv)
    out = kernels.attention(qkv_out, heads, bias, plan, scale, logit_scale, attn_drop)
    if not drop_prob and not post_norm and not proj_drop:  # the product adds the residual
        return kernels.project(out, proj, plan, index, zeros, x)
    branch = kernels.project(out, proj, plan, index, zeros, None)
    if proj_drop:
        branch = F.dropout(branch, proj_drop)
    # drawn after the dropouts, as the modules draw them
    keep = drop_path_keep(x.shape[0], drop_prob, branch.dtype, x.device) if drop_prob else None
    if post_norm:
        return _add_branch(x, branch, keep, norm1)
    return x + branch if keep is None else torch.addcmul(x, branch, keep)


def ffn_half(x: Tensor, norm2: Tuple[Tensor, Tensor, float], fc1: Tuple[Tensor, Tensor],
             fc2: Tuple[Tensor, Tensor], drop_prob: float = 0.,
             kernels: Optional['BlockKernels'] = None, post_norm: bool = False,
             ffn_drop: float = 0.) -> Tensor:
    """``x + drop_path(fc2(gelu(fc1(norm2(x)))))``: [B, H*W, C] -> [B, H*W, C]; with
    ``post_norm`` (SwinV2) ``x + drop_path(norm2(fc2(gelu(fc1(x)))))``; ``ffn_drop``: dropout
    after GELU and after fc2 (training only), in stock autograd; the other arguments as
    :func:`attention_half`'s."""
    kernels = kernels or GENERIC
    pre = None if post_norm else norm2
    if ffn_drop:
        hidden = F.dropout(F.gelu(kernels.linear(_pre_norm_autograd(x, pre), *fc1)), ffn_drop)
        branch = F.dropout(kernels.linear(hidden, *fc2), ffn_drop)
    elif torch.is_grad_enabled():
        if not post_norm:
            return apply_function(_NormMLP, x, *norm2, *fc1, *fc2, drop_prob, kernels)
        branch = apply_function(_NormMLP, x, None, None, 0., *fc1, *fc2, 0., kernels)
    else:
        # Inference: each intermediate let go as soon as the next is made, GELU in place (or
        # in the product's epilogue) and the residual added by the product where the kernels
        # can.
        hidden = kernels.linear_gelu(x if pre is None else _layer_norm(x, x.shape[-1:], *pre)[0],
                                     *fc1)
        if not drop_prob and not post_norm:
            return kernels.linear_residual(hidden, *fc2, x)
        branch = kernels.linear(hidden, *fc2)
    keep = drop_path_keep(x.shape[0], drop_prob, branch.dtype, x.device) if drop_prob else None
    return _add_branch(x, branch, keep, norm2 if post_norm else None)


def _pre_norm_autograd(x: Tensor, norm: Optional[tuple]) -> Tensor:
    """:func:`_pre_norm` in stock autograd."""
    return x if norm is None else F.layer_norm(x, x.shape[-1:], *norm)


class BlockKernels(NamedTuple):
    """The primitives :func:`attention_half` and :func:`ffn_half` run: one row of choices.

    linear(x, weight, bias): the product in the products' dtype (autocast's inside an autocast
        region); weights in their own dtype. linear_residual(x, weight, bias, residual): the
        product plus a residual. linear_gelu(x, weight, bias): the product then exact GELU,
        without autograd. grad_input(grad, weight): grad @ weight, both in grad's dtype.
        bias_grad(grad, 0, dtype=dtype): grad summed over its rows, in dtype (``torch.sum``'s
        signature).
        attention(qkv, heads, bias, plan, scale, logit_scale, dropout_p): [B, nW * N, 3C] ->
            [B * nW, N, C] (logit_scale: cosine attention, or None).
        project(out, proj, plan, index, zeros, residual): ``proj(out)`` in map order, plus
            ``residual`` (added by the product where the kernels can) unless it is None.
    """
    name: str
    linear: Callable
    linear_residual: Callable
    linear_gelu: Callable
    grad_input: Callable
    bias_grad: Callable
    attention: Callable
    project: Callable


def _sdpa_attention(qkv: Tensor, heads: int, bias: Tensor, plan, scale: float,
                    logit_scale: Optional[Tensor], dropout_p: float) -> Tensor:
    """One SDPA call for all windows of all images (``attention.generic_window_attention``):
    q, k, v views of the projection [B, nW * N, 3C]."""
    nw = plan.num_windows
    b, length, c3 = qkv.shape
    if logit_scale is None:
        q, k, v = qkv.view(b * nw, length // nw, 3, heads, c3 // 3 // heads).permute(
            2, 0, 3, 1, 4).unbind(0)  # as window_products.qkv_views, one Python call less
    else:  # cosine attention: q and k differentiated apart, their gradients written in place
        q, k, v = split_qkv(qkv.view(b * nw, length // nw, c3), heads)
        (q, k), scale = scaled_cosine_query_key(q, k, logit_scale), 1.0
    return generic_window_attention(q, k, v, bias, plan.mask, scale, dropout_p, nw, qkv.dtype,
                                    False)


def _project_in_window_order(out: Tensor, proj, plan, index, zeros,
                             residual: Optional[Tensor]) -> Tensor:
    """The projection in window order (it keeps SDPA's output, which SDPA keeps anyway), then
    back to map order (and onto the residual)."""
    out = F.linear(out, *proj)
    out = _gather(out.view(out.shape[0] // plan.num_windows, -1, out.shape[-1]), plan.scatter,
                  False)
    if residual is None:
        return out
    if torch.is_grad_enabled() or out.dtype != residual.dtype:
        return residual + out
    return out.add_(residual)  # which nothing else holds


def _linear_residual(x: Tensor, weight: Tensor, bias: Optional[Tensor],
                     residual: Tensor) -> Tensor:
    out = F.linear(x, weight, bias)
    return out.add_(residual) if out.dtype == residual.dtype else residual + out


# Plain functions and C callables, no lambdas: each Python frame is host time a GPU waits for.
GENERIC = BlockKernels(
    'generic', F.linear, linear_residual=_linear_residual,
    linear_gelu=lambda x, weight, bias: _gelu_(F.linear(x, weight, bias)),
    # bias gradients summed into the weight's dtype in one kernel (a GPU's reduction
    # accumulates in float32 either way; the launch is what counts there)
    grad_input=torch.mm, bias_grad=torch.sum, attention=_sdpa_attention,
    project=_project_in_window_order)


def _cast(x: Tensor, weight: Tensor, bias: Optional[Tensor]):
    """The weights in the products' dtype, cast afresh (inside a Function autocast's cache
    does not reach, and a kept cast would hold a copy of every weight from step to step)."""
    dtype = compute_dtype(x)
    if weight.dtype == dtype:
        return weight, bias
    return weight.to(dtype), None if bias is None else bias.to(dtype)


def _project_in_map_order(out: Tensor, proj, plan, index, zeros,
                          residual: Optional[Tensor]) -> Tensor:
    """Back to map order first (the window attention op keeps its input, not its output), so
    the projection keeps the reordered output and adds the residual itself
    (``ops.recompute.linear_keeping_input``: its weight cast made again in backward)."""
    out = gather_tokens(out.view(out.shape[0] // plan.num_windows, -1, out.shape[-1]),
                        plan.scatter, index, False, zeros)
    return linear_keeping_input(out, *proj, residual)


def _window_attention_op(qkv: Tensor, heads: int, bias: Tensor, plan, scale: float,
                         logit_scale: Optional[Tensor], dropout_p: float) -> Tensor:
    """``attention.window_attention_qkv`` (the registered op on the packed projection)."""
    nw = plan.num_windows
    return window_attention_qkv(qkv.view(-1, qkv.shape[1] // nw, qkv.shape[2]), heads, bias,
                                plan.mask, scale, dropout_p, windows_per_image=nw,
                                logit_scale=logit_scale)


CPU = BlockKernels(
    'cpu', lambda x, weight, bias: linear(x, *_cast(x, weight, bias)),
    linear_residual=lambda x, weight, bias, residual: linear_residual(
        x, *_cast(x, weight, bias), residual),
    linear_gelu=lambda x, weight, bias: linear(x, weight, bias, gelu=True),
    grad_input=lambda grad, weight: linear(grad, weight.t()),
    # In the product's dtype, then cast: ATen's bf16 sum accumulates in float32 and rounds
    # once, where sum(dtype=float32) first casts the whole gradient (12x slower on [32768,
    # 384], Xeon with AMX).
    bias_grad=lambda grad, dim, dtype: grad.sum(dim).to(dtype),
    attention=_window_attention_op, project=_project_in_map_order)

KERNELS = {'generic': GENERIC, 'cpu': CPU}


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
    """``linear(layer_norm(neighbourhoods(x)), weight)`` (no norm where ``norm_weight`` is
    None: SwinV2's norms the reduction instead), the patch merging of a stage: keeps x (the
    stage output, which the output norm keeps anyway), and recomputes the neighbourhoods and
    the norm (its statistics too) in backward."""

    @staticmethod
    def forward(ctx, x: Tensor, h: int, w: int, norm_weight: Optional[Tensor],
                norm_bias: Optional[Tensor], eps: float, weight: Tensor,
                kernels: BlockKernels) -> Tensor:
        t = _neighbourhoods(x, h, w)
        y = t if norm_weight is None else _layer_norm(t, t.shape[-1:], norm_weight, norm_bias,
                                                      eps)[0]
        ctx.save_for_backward(x, norm_weight, norm_bias, weight)
        ctx.hw, ctx.eps, ctx.kernels = (h, w), eps, kernels
        return kernels.linear(y, weight, None)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, norm_weight, norm_bias, weight = ctx.saved_tensors
        (h, w), dtype = ctx.hw, grad.dtype
        t = _neighbourhoods(x, h, w)
        b, length, c4 = t.shape
        y, mean, rstd = (t, None, None) if norm_weight is None else _layer_norm(
            t, t.shape[-1:], norm_weight, norm_bias, ctx.eps)
        if y.dtype != dtype:
            y = y.to(dtype)
        grad = grad.reshape(-1, grad.shape[-1])
        grad_weight = grad.t().mm(y.view(-1, c4))
        grad_t = ctx.kernels.grad_input(
            grad, weight if weight.dtype == dtype else weight.to(dtype)).view(t.shape)
        if grad_t.dtype != t.dtype:
            grad_t = grad_t.to(t.dtype)
        needs = ctx.needs_input_grad
        grad_norm_weight = grad_norm_bias = None
        if norm_weight is not None:
            grad_t, grad_norm_weight, grad_norm_bias = _layer_norm_backward(
                grad_t, t, t.shape[-1:], mean, rstd, norm_weight, norm_bias,
                [needs[0], needs[3], needs[4]])
        grad_x = None
        if needs[0]:  # the neighbourhoods' gradient back in map order, cropped
            c, hh, ww = c4 // 4, (h + 1) // 2, (w + 1) // 2
            grad_x = grad_t.view(b, hh, ww, c, 2, 2).permute(0, 1, 4, 2, 5, 3).reshape(
                b, 2 * hh, 2 * ww, c)
            if h % 2 or w % 2:
                grad_x = grad_x[:, :h, :w]
            grad_x = grad_x.reshape(b, h * w, c)
        if grad_weight.dtype != weight.dtype:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_x, None, None, grad_norm_weight, grad_norm_bias, None, grad_weight, None


def patch_merge(x: Tensor, hw: Tuple[int, int], norm: Optional[Tuple[Tensor, Tensor, float]],
                weight: Tensor, kernels: BlockKernels = GENERIC) -> Tensor:
    """A stride-2 patch merging: [B, H*W, C] -> [B, H'*W', C_out], each 2x2 neighbourhood
    concatenated, normalised (LayerNorm ``norm``: weight, bias, eps; None: not normalised) and
    reduced by ``weight`` [C_out, 4C] (no bias), with the block's kernels."""
    if torch.is_grad_enabled():
        return apply_function(_MergeNormReduce, x, hw[0], hw[1], *(norm or (None, None, 0.)),
                              weight, kernels)
    t = _neighbourhoods(x, hw[0], hw[1])
    return kernels.linear(t if norm is None else _layer_norm(t, t.shape[-1:], *norm)[0], weight,
                          None)
