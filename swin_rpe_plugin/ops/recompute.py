"""A linear layer whose input is recomputed in backward instead of kept.

For the parts that ``ops/block.py``'s Functions do not write out: the patch embedding
recomputes its rows of patches from the image, a patch merging's plain form its 2x2
neighbourhoods (and norm) from the stage output, and the CPU kernels' output projection takes an
identity prefix (it keeps its input, as ``F.linear`` would, and adds the residual itself).
Unlike activation checkpointing, the GEMM itself is never recomputed. Under autocast the weight
is kept in its own dtype and cast again in backward, and the prefix is recomputed under the same
autocast state as in forward, so both passes see the same numbers.

Imports torch only.
"""
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from ..compat import apply_function, gradient_edge, is_compiling
from .dispatch import autocast_context, autocast_state, compute_dtype, use_cpu_fast_paths
from .linear import linear, linear_residual

__all__ = ['linear_keeping_input', 'linear_with_recomputed_input']


class _LinearRecomputedInput(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor],
                residual: Optional[Tensor], prefix: Callable, num_prefix_params: int,
                *prefix_params: Tensor) -> Tensor:
        ctx.prefix = prefix
        ctx.num_prefix_params = num_prefix_params
        ctx.has_bias = bias is not None
        device = x.device.type
        ctx.autocast = autocast_state(device)  # (device, dtype, enabled); off where none
        ctx.weight_dtype = weight.dtype
        # Backward keeps the weight itself and casts it again: autocast's own autograd keeps
        # its bf16/fp16 cast of every weight from forward to backward (2 bytes a parameter,
        # 52 MiB for Swin-T), which a cast gives back for 6 bytes a parameter moved (on a GPU,
        # one launch a layer: 52 of a bf16 Swin-T step's ~900, kept for the memory).
        ctx.generic = not use_cpu_fast_paths(x)
        ctx.save_for_backward(x, weight, *prefix_params)
        if ctx.autocast[2] and weight.is_floating_point():
            weight = weight.to(ctx.autocast[1])  # not _cast_parameter's cache: freed now
        with torch.no_grad():
            y = prefix(x)
            ctx.product_dtype = compute_dtype(y)
            if residual is None:
                return linear(y, weight, bias)
            return linear_residual(y, weight, bias, residual)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x, weight, *prefix_params = ctx.saved_tensors
        with torch.enable_grad(), autocast_context(*ctx.autocast):
            x_ = x.detach().requires_grad_(ctx.needs_input_grad[0])
            y = ctx.prefix(x_)
        grad_residual = grad_out if ctx.needs_input_grad[3] else None
        product_dtype = ctx.product_dtype
        grad_out = grad_out.to(product_dtype)  # the gradient of the product's own output
        grad_flat = grad_out.reshape(-1, grad_out.shape[-1])
        grad_weight = grad_bias = None
        if ctx.needs_input_grad[1]:
            y_flat = y.detach().reshape(-1, y.shape[-1]).to(product_dtype)
            grad_weight = (grad_flat.t() @ y_flat).to(ctx.weight_dtype)
            del y_flat
        if ctx.has_bias and ctx.needs_input_grad[2]:
            # In the product's dtype, as autocast's own addmm backward sums it: ATen's bf16
            # sum accumulates in float32 and rounds once, while sum(dtype=float32) first casts
            # the whole gradient to float32 (12x slower on [32768, 384], Xeon with AMX).
            # On the generic path, summed into the weight's dtype in one kernel (a GPU's
            # reduction accumulates in float32 either way; the launch is what counts there).
            grad_bias = grad_flat.sum(0, dtype=ctx.weight_dtype) if ctx.generic else \
                grad_flat.sum(0).to(ctx.weight_dtype)
        needs = [ctx.needs_input_grad[0], *ctx.needs_input_grad[6:]]
        wanted = [t for t, need in zip([x_, *prefix_params], needs) if need]
        y_dtype = y.dtype
        # Differentiate the prefix through y's gradient edge, and let y go before grad_y is
        # made: LayerNorm's and GELU's backwards keep their inputs, not y, so one tensor of
        # y's size less is live at the step's peak.
        root = None if not wanted else gradient_edge(y) if y.grad_fn is not None else y
        del y
        with torch.no_grad():
            grad_y = linear(grad_out, weight.t().to(product_dtype)).to(y_dtype)
        grads = iter(torch.autograd.grad(root, wanted, grad_y) if wanted else ())
        grad_x = next(grads) if ctx.needs_input_grad[0] else None
        grad_params = [next(grads) if need else None for need in ctx.needs_input_grad[6:]]
        return (grad_x, grad_weight, grad_bias, grad_residual, None, None, *grad_params)


def linear_with_recomputed_input(x: Tensor, prefix: Callable[[Tensor], Tensor],
                                 prefix_params: Sequence[Tensor], weight: Tensor,
                                 bias: Optional[Tensor], residual: Optional[Tensor] = None
                                 ) -> Tensor:
    """``linear(prefix(x), weight, bias)`` (``+ residual`` if given, added by the product
    itself where :func:`~.linear.linear_residual` can), keeping x instead of prefix(x) for
    backward.

    Args:
        x: input of the prefix, [..., C_in'] (kept for backward).
        prefix: cheap function to recompute in backward, e.g. LayerNorm; it may use only the
            tensors in prefix_params as trainable parameters.
        prefix_params: the parameters prefix uses (they receive gradients).
        weight, bias: of the linear layer, [C_out, C_in] and [C_out].
        residual: [..., C_out] added to the output (its gradient is the output's), or None.

    Returns:
        [..., C_out].
    """
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or any(p.requires_grad for p in prefix_params)
        or (residual is not None and residual.requires_grad))
    # Tracers (FLOP counters, exporters) see plain ops; under torch.compile the partitioner
    # decides what backward keeps or recomputes (it cannot trace autograd.grad in a backward).
    if not needs_grad or torch.jit.is_tracing() or is_compiling():
        y = prefix(x)
        return linear(y, weight, bias) if residual is None else \
            linear_residual(y, weight, bias, residual)
    return apply_function(_LinearRecomputedInput, x, weight, bias, residual, prefix,
                          len(prefix_params), *prefix_params)


def _identity(x: Tensor) -> Tensor:
    return x


def linear_keeping_input(x: Tensor, weight: Tensor, bias: Optional[Tensor],
                         residual: Optional[Tensor] = None) -> Tensor:
    """``linear(x, weight, bias)`` (``+ residual``) whose backward keeps x and the weight in
    its own dtype: under autocast the weight's cast is made again in backward instead of
    kept (see :func:`linear_with_recomputed_input`, with the identity as prefix); the CPU
    kernels' output projection (``ops.block.CPU``)."""
    return linear_with_recomputed_input(x, _identity, [], weight, bias, residual)
