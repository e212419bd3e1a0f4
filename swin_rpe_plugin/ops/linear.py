"""Linear layers through oneDNN on CPU.

``F.linear`` on CPU runs MKL's sgemm, which on AMD processors takes a slow generic path: on
this project's EPYC machine it reaches about 55-110 GFLOP/s per core where oneDNN's matmul
(``torch.ops.mkldnn._linear_pointwise``, what inductor emits for CPU linears) reaches 200-240 on
the shapes of a Swin block. The same fp32 products are summed in another order, so results
agree with ``F.linear`` to float32 rounding. Anything else (GPU, other dtypes, no oneDNN) falls
back to ``F.linear``.

Imports torch only.
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ['linear', 'onednn_available']

_OP = getattr(torch.ops.mkldnn, '_linear_pointwise', None) if hasattr(torch.ops, 'mkldnn') \
    else None
_MKLDNN = torch.backends.mkldnn.is_available()


def onednn_available(x: Tensor) -> bool:
    """True when x takes the oneDNN path (CPU float32 with oneDNN built in).

    Not under torch.compile (inductor picks its own kernels: with
    ``torch._inductor.config.freezing = True`` oneDNN ones) nor under a tracer.
    """
    if torch.compiler.is_compiling():  # checked first: the other checks break dynamo graphs
        return False
    return (_OP is not None and x.device.type == 'cpu' and x.dtype == torch.float32
            and _MKLDNN and not torch.jit.is_tracing())


def _onednn(x: Tensor, weight: Tensor, bias: Optional[Tensor], attr: str = 'none') -> Tensor:
    shape = x.shape
    out = _OP(x.reshape(-1, shape[-1]), weight, bias, attr, [], 'none' if attr == 'gelu' else '')
    return out.view(*shape[:-1], weight.shape[0])


class _Linear(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _onednn(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        grad2d = grad.reshape(-1, grad.shape[-1])
        if ctx.needs_input_grad[0]:
            grad_x = _onednn(grad, weight.t(), None)
        if ctx.needs_input_grad[1]:
            grad_w = grad2d.t() @ x.reshape(-1, x.shape[-1])
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad2d.sum(0)
        return grad_x, grad_w, grad_b


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
           gelu: bool = False) -> Tensor:
    """``F.linear(x, weight, bias)`` (then exact GELU if ``gelu``), on oneDNN where possible.

    Args:
        x: [..., C_in]; weight: [C_out, C_in]; bias: [C_out] or None.
        gelu: apply the exact (erf) GELU to the output; fused into the matmul at inference.
    """
    if not onednn_available(x) or weight.dtype != torch.float32:
        out = F.linear(x, weight, bias)
        return F.gelu(out) if gelu else out
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
    if not needs_grad:
        return _onednn(x, weight, bias, 'gelu' if gelu else 'none')
    out = _Linear.apply(x, weight, bias)
    return F.gelu(out) if gelu else out
