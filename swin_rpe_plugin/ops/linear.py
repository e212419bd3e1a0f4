"""Linear layers through oneDNN on CPUs where it is the faster library.

``F.linear`` on CPU runs MKL's sgemm. On AMD processors with AVX-512 (Zen 5) that takes a slow
generic path, about 55-110 GFLOP/s per core, where oneDNN's matmul
(``torch.ops.mkldnn._linear_pointwise``, what inductor emits for frozen CPU linears) reaches
200-240 on the shapes of a Swin block; on AVX2-only CPUs (Zen 3) MKL is about 10% faster than
oneDNN, and on Intel MKL is as fast or faster. Which library serves a product is a fixed rule per
device, dtype and CPU class (``dispatch.choose_kernel``), never a measurement, so two processes
with one seed compute bitwise the same. Where the rule names MKL the layer is plain ``F.linear``
(autocast and the compiler see it as it is); where it names oneDNN the product is the registered op
``swin_rpe::linear``, and under bf16 autocast that op runs on bf16 operands (what autocast would
have chosen: bf16 products, float32 accumulation). The same fp32 products are summed in another
order, so the two agree to float32 rounding. Anything else (other devices, fp16, no oneDNN, the
generic backend of ``dispatch.py``) runs ``F.linear``.

Imports torch only.
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from ..compat import (WeakIdKeyDictionary, custom_op, is_compiling, is_exporting,
                      native_products, onednn_linear_op)
from .dispatch import choose_kernel, compute_dtype, is_tracing, use_cpu_fast_paths
from .kept import sources_key

__all__ = ['linear', 'linear_residual', 'fuses_residual', 'onednn_available']

_OP = onednn_linear_op()
_OP_BINARY = getattr(_OP, 'binary', None)  # + a tensor in the epilogue (linear_residual)
_MKLDNN = _OP is not None
# oneDNN has bf16 inner products only on CPUs with native bf16 (avx512_bf16, AMX): elsewhere
# (an AVX2-only Zen 3, say) it cannot create the primitive, and bf16 products take F.linear.
_ONEDNN_BF16 = _OP is not None and native_products()[torch.bfloat16]


def onednn_available(x: Tensor, kind: str = 'linear') -> bool:
    """True when x takes the oneDNN path: CPU fast paths allowed (``dispatch.py``), oneDNN
    built in, products in float32, or in bfloat16 on a CPU whose oneDNN has bf16 kernels
    (autocast's dtype or x's own), and the kernel rule naming oneDNN for them.

    Under torch.compile too (the product is the registered op ``swin_rpe::linear``, which
    the compiler keeps as one call); not under a tracer or exporter, which see ``F.linear``.
    """
    if _OP is None or not _MKLDNN or not use_cpu_fast_paths(x):
        return False
    dtype = compute_dtype(x)
    if not (dtype == torch.float32 or (dtype == torch.bfloat16 and _ONEDNN_BF16)):
        return False
    return choose_kernel(kind, x.device.type, dtype) == 'onednn'



def _onednn(x: Tensor, weight: Tensor, bias: Optional[Tensor], attr: str = 'none',
            residual: Optional[Tensor] = None) -> Tensor:
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    if residual is not None:  # the binary 'add' epilogue reads it as the output is written
        out = _OP.binary(flat, residual.reshape(-1, weight.shape[0]), weight, bias, 'add')
    else:
        out = _OP(flat, weight, bias, attr, [], 'none' if attr == 'gelu' else '')
    return out.view(*shape[:-1], weight.shape[0])


def _product(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """x @ weight.T (+ bias) by the rule's library for x's device and dtype (no autograd)."""
    if choose_kernel('linear', x.device.type, x.dtype) == 'onednn':
        return _onednn(x, weight, bias)
    return F.linear(x, weight, bias)


# The product as a registered op (shape function and backward beside it), so torch.compile sees
# one opaque call and keeps the oneDNN kernel instead of switching the fast path off.
@custom_op('swin_rpe::linear', mutates_args=())
def _linear_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], gelu: bool,
               residual: Optional[Tensor] = None) -> Tensor:
    """x @ weight.T (+ bias), then exact GELU if ``gelu`` (fused: no gradient for it), or
    ``+ residual`` (of the output's shape and dtype) in the product's epilogue."""
    if gelu:  # the fused epilogue is oneDNN's alone
        if choose_kernel('linear_gelu', x.device.type, x.dtype) == 'onednn':
            return _onednn(x, weight, bias, 'gelu')
        return torch.ops.aten.gelu_(F.linear(x, weight, bias))  # over the op's own product
    if residual is not None:
        if choose_kernel('linear', x.device.type, x.dtype) == 'onednn':
            return _onednn(x, weight, bias, residual=residual)
        return residual + F.linear(x, weight, bias)
    return _product(x, weight, bias)


@_linear_op.register_fake
def _(x: Tensor, weight: Tensor, bias: Optional[Tensor], gelu: bool,
      residual: Optional[Tensor] = None) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _linear_setup(ctx, inputs, output) -> None:
    x, weight, bias, gelu, residual = inputs
    if gelu:
        raise RuntimeError('swin_rpe::linear with gelu=True has no gradient: call it under '
                           'no_grad, or apply F.gelu to its output')
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None
    ctx.has_residual = residual is not None


def _linear_backward(ctx, grad: Tensor):
    x, weight = ctx.saved_tensors
    grad_x = grad_w = grad_b = None
    grad2d = grad.reshape(-1, grad.shape[-1])
    if ctx.needs_input_grad[0]:
        grad_x = _linear_op(grad, weight.t(), None, False)
    if ctx.needs_input_grad[1]:
        grad_w = grad2d.t() @ x.reshape(-1, x.shape[-1])
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_b = grad2d.sum(0)
    grad_residual = grad if ctx.has_residual and ctx.needs_input_grad[4] else None
    return grad_x, grad_w, grad_b, None, grad_residual


_linear_op.register_autograd(_linear_backward, setup_context=_linear_setup)


# bf16 copies of parameters for products that need no gradient. autocast caches its casts only
# for the ops it sees, and these bypass it, so without this every inference call would cast
# every weight again. Weakly keyed by the tensor and checked against ``kept.sources_key`` (version,
# storage, generation), so an updated or freed weight never serves a stale copy; one reduced copy
# per parameter stays alive with it.
_CASTS = WeakIdKeyDictionary()


def _cast_parameter(t: Tensor, dtype: torch.dtype) -> Tensor:
    """A parameter in ``dtype``: at inference the cast made at the last call while the
    parameter is unchanged (autocast casts every weight again in every forward: a pass over
    the model), under autograd or a compiler a fresh, differentiable cast."""
    if t.dtype == dtype:
        return t
    if (torch.is_grad_enabled() and t.requires_grad) or is_compiling():
        return t.to(dtype)  # differentiable; compiled code folds or fuses the cast itself
    key = sources_key((t,), dtype)
    entry = _CASTS.get(t)
    if entry is None or entry[0] != key:
        entry = (key, t.detach().to(dtype))
        _CASTS[t] = entry
    return entry[1]


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
           gelu: bool = False) -> Tensor:
    """``F.linear(x, weight, bias)`` (then exact GELU if ``gelu``), on oneDNN where possible.

    Args:
        x: [..., C_in]; weight: [C_out, C_in]; bias: [C_out] or None.
        gelu: apply the exact (erf) GELU to the output; fused into the matmul at inference.
    """
    if gelu and not _needs_grad(x, weight, bias) and onednn_available(x, 'linear_gelu') \
            and weight.dtype.is_floating_point:
        dtype = compute_dtype(x)  # inference: GELU in the product's epilogue, one pass less
        return _linear_op(x.to(dtype), _cast_parameter(weight, dtype),
                          None if bias is None else _cast_parameter(bias, dtype), True)
    if gelu:  # a gradient through GELU, or no fused epilogue: the product, then GELU
        out = linear(x, weight, bias)
        if _needs_grad(x, weight, bias) or is_tracing(x):
            return F.gelu(out)
        # Inference: over the product, which nothing else holds. The same bytes as F.gelu but
        # no second 4C-wide tensor: glibc maps 32 MiB and more as fresh pages, whose faults
        # cost more than GELU (stage 1 of Swin-T, 512x512 b2, 48 MiB: 23 against 5 ms).
        return torch.ops.aten.gelu_(out)
    if not onednn_available(x) or not weight.dtype.is_floating_point:
        dtype = compute_dtype(x)
        if dtype != weight.dtype and not _needs_grad(x, weight, bias) \
                and weight.dtype.is_floating_point and not torch.jit.is_tracing():
            # Inference under autocast: the weights' casts kept from the last call (autocast
            # would cast every weight again in every forward: a pass over the model).
            weight = _cast_parameter(weight, dtype)
            bias = None if bias is None else _cast_parameter(bias, dtype)
        return F.linear(x, weight, bias)
    dtype = compute_dtype(x)
    # oneDNN ops are outside autocast's reach: cast as autocast would (differentiably).
    x, weight = x.to(dtype), _cast_parameter(weight, dtype)
    bias = None if bias is None else _cast_parameter(bias, dtype)
    return _linear_op(x, weight, bias, False)


def _needs_grad(*tensors: Optional[Tensor]) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def fuses_residual(x: Tensor, residual: Tensor) -> bool:
    """True where :func:`linear_residual` adds the residual inside the product: oneDNN's
    binary epilogue where the rule names oneDNN and the residual has the product's dtype
    (the float32 stream, or a bf16 one under bf16 autocast: the epilogue adds before the
    output is rounded), else the plain library's ``addmm_`` into the residual for float32
    products (no autocast: a bf16 product cannot accumulate into a float32 stream); never
    traced or exported."""
    if torch.jit.is_tracing() or is_exporting():
        return False
    if onednn_available(x):
        return _OP_BINARY is not None and residual.dtype == compute_dtype(x)
    return compute_dtype(x) == torch.float32 and x.dtype == residual.dtype == torch.float32


def linear_residual(x: Tensor, weight: Tensor, bias: Optional[Tensor],
                    residual: Tensor) -> Tensor:
    """``residual + F.linear(x, weight, bias)``, with the residual added by the product itself.

    ``F.linear`` on CPU copies the bias into its output and the product adds onto it (two
    passes of the output), and the residual add is three more (two reads, one write). Where
    the rule names oneDNN, its epilogue adds bias and residual as the output is written (one
    read of the residual; ``swin_rpe::linear``, whose backward keeps x and the weight).
    Elsewhere the bias is added to the residual in one pass and the product accumulates into
    that sum in place (``addmm_``, beta = 1): three passes instead of five, on any device.
    Autograd sees add + addmm_, whose backwards keep only x (and the weight), as ``F.linear``
    does.

    Args:
        x: [..., C_in]; weight: [C_out, C_in]; bias: [C_out] or None; residual: [..., C_out].
    """
    if not fuses_residual(x, residual):
        return residual + linear(x, weight, bias)
    if onednn_available(x):
        dtype = compute_dtype(x)
        return _linear_op(x.to(dtype), _cast_parameter(weight, dtype),
                          None if bias is None else _cast_parameter(bias, dtype), False,
                          residual)
    # 2-D from the start: addmm_ on a view of the sum would make autograd rebase the view.
    flat = residual.reshape(-1, residual.shape[-1])
    out = flat + bias if bias is not None else flat.clone()
    out.addmm_(x.reshape(-1, x.shape[-1]), weight.t())
    return out.view(residual.shape)
