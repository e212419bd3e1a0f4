"""The chunked window products behind ``attention.py``'s registered ops: the CPU path's explicit
forward and the recomputed backward of every path (CPU and generic), a chunk of one image's
windows at a time, and the mask copy their kernels use.

Each chunk's N x N matrices (logits, probabilities, their gradients) are about 4 MiB: they stay
near the cache, and the transient memory does not grow with the image. Products run in q's dtype
where the device multiplies it natively (:func:`backward_product_dtype`), the softmax and its
gradient in float32; see ``docs/mixed-precision-and-devices.md``.

Imports torch only.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor
from ..compat import (WeakIdKeyDictionary, autocast_context, custom_op, native_products,
                      softmax_backward_data)
from .masks import MASK_VALUE

__all__ = ['CHUNK_ELEMENTS', 'NATIVE_PRODUCTS', 'backward_product_dtype', 'underflowing_mask',
           'explicit_per_image', 'qkv_views', 'attention_backward_op',
           'attention_qkv_backward_op']


def underflowing_mask(mask: Tensor) -> Tensor:
    """The mask with every masked entry (<= MASK_VALUE, -100) doubled, for the kernels' own use.

    exp(-100 + logit - max) is a float32 denormal (about 1e-44), and Intel CPUs compute with
    denormals many times slower: the recomputed backward of a shifted Swin-T block took 47 ms
    against 5 ms unmasked (stage 4, 512x512 b2, Xeon with AMX), all of it in the softmax and
    the products that read its denormal probabilities. exp(-200 + ...) underflows to an exact
    0. Both weights are below float32 resolution next to any unmasked key, and every real
    query sees at least itself, so outputs and gradients are the same to float32 rounding. A
    row masked everywhere (a padding query, whose output is dropped) keeps -100: its maximum is
    masked too, so it makes no denormals, and doubling it would only add float32 rounding at
    200 (1.5e-5 off the reference's -100). Other additive values pass unchanged. The masks users see (plans,
    pictures, exports) keep the reference's -100. Made once per mask (plans are cached, so
    once per plan), again only if the mask is changed in place."""
    # Inference tensors have no version counter: made under inference_mode, they are not
    # cached (nor can they be changed in place outside it).
    version = None if mask.is_inference() else mask._version
    cached = _UNDERFLOWING.get(mask)
    if cached is not None and version is not None and cached[0] == version:
        return cached[1]
    masked = mask <= MASK_VALUE
    doubled = torch.where(masked & ~masked.all(-1, keepdim=True), mask * 2, mask)
    if version is not None:
        _UNDERFLOWING[mask] = (version, doubled)
    return doubled


_UNDERFLOWING = WeakIdKeyDictionary()  # mask -> (its version, the doubled mask)


def _flat(t: Tensor) -> Tensor:
    """[w, heads, N, x] -> [w * heads, N, x]: the layout batched products take."""
    return t.reshape(-1, t.shape[-2], t.shape[-1])


# Window-heads' N x N matrices per chunk of the loops below (1 MiB in float32): the chunk's
# logits, probabilities and their gradients stay near the cache, and the transient memory no
# longer grows with the image (per image, the backward of an 800x1216 image's first stage made
# 147 MB of them at once). 4 MiB chunks put the allocator peak of a Swin-T train step at
# 512x512 b2 in stage 4's attention backward (9 windows x 24 heads a chunk): 1 MiB takes
# 7.2 MiB off it (0.601 -> 0.595x mmdet's) for 27 MiB more moved (the bias gradient's sums).
CHUNK_ELEMENTS = 1 << 18


def window_chunks(bw: int, nw: int, mask: Optional[Tensor], heads: int, n: int):
    """(lo, hi, mask of the chunk's last windows or None): consecutive windows of one image,
    as many as keep ``windows * heads * N * N`` within :data:`CHUNK_ELEMENTS` (at least one).
    Each image's mask ([nM, N, N], or [B, nM, N, N] one per image) covers its last nM
    windows; a chunk gets the rows of the masked windows it holds, which are again its last."""
    per = max(1, CHUNK_ELEMENTS // (heads * n * n))
    for image, start in enumerate(range(0, bw, nw)):
        image_mask = None if mask is None else (mask[image] if mask.dim() == 4 else mask)
        cut = start + nw - (0 if mask is None else image_mask.shape[0])  # first masked
        for lo in range(start, start + nw, per):
            hi = min(lo + per, start + nw)
            first = max(lo, cut)
            yield lo, hi, (image_mask[first - cut:hi - cut] if first < hi else None)


def image_probabilities(qi: Tensor, ki: Tensor, bias: Tensor, mask: Optional[Tensor],
                         nw: int) -> Tensor:
    """softmax(qi ki^T + bias + mask) of nW consecutive windows of one image, [nW * heads, N,
    N] in bias's dtype (float32, or float64): qi pre-scaled and ki dense, [nW * heads, N, d],
    in the products' dtype; the mask covers the last nM of the nW windows. The bias add is
    the cast too: one pass from the product's dtype to the softmax's."""
    heads, n = bias.shape[0], bias.shape[-1]
    logits = torch.add(torch.bmm(qi, ki.transpose(1, 2)).view(nw, heads, n, n), bias)
    if mask is not None:
        logits[nw - mask.shape[0]:] += mask.unsqueeze(1).to(logits.dtype)
    return torch.softmax(logits, dim=-1).view(-1, n, n)


def explicit_per_image(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Optional[Tensor],
                        scale: float, nw: int) -> Tensor:
    """The CPU path's forward by explicit products, a chunk of one image's windows at a time
    (:func:`window_chunks`, as in the backward, whose :func:`image_probabilities` it
    shares): q k^T, the
    bias (+ mask) added in float32, softmax in float32, @ v. Products in q's dtype where the
    CPU multiplies it natively (:func:`backward_product_dtype`), else float32; the output in
    q's dtype and the layout the projection takes, [B * nW, N, heads * head_dim]. The rule
    takes it where 49-token windows make SDPA's flash kernel the slower one."""
    product = backward_product_dtype(q.dtype, q.device.type)
    bias = bias.to(torch.promote_types(product, torch.float32))
    mask = None if mask is None else underflowing_mask(mask)
    bw, heads, n, head_dim = q.shape
    out = torch.empty(bw, n, heads, head_dim, dtype=q.dtype, device=q.device)
    for lo, hi, chunk_mask in window_chunks(bw, nw, mask, heads, n):
        # One pass each makes the strided views of the qkv output dense (q scaled on the way).
        qi = _flat(torch.mul(q[lo:hi], scale, out=torch.empty(
            hi - lo, heads, n, head_dim, dtype=product, device=q.device)))
        ki, vi = (_flat(t[lo:hi].to(product, memory_format=torch.contiguous_format))
                  for t in (k, v))
        p = image_probabilities(qi, ki, bias, chunk_mask, hi - lo)
        _products_into(out[lo:hi].transpose(1, 2), p.to(product), vi)
    return out.view(bw, n, heads * head_dim)


def _products_into(target: Tensor, a: Tensor, b: Tensor, scale: Optional[float] = None) -> None:
    """target = a @ b (* scale): a and b dense [w * heads, ., .], target [w, heads, N, d] in
    any layout (a dense gradient, the output's or the qkv projection's columns).

    One batched product, written in place where the target is dense in the product's dtype,
    else into a chunk-sized buffer copied into the target while it is still in cache. A
    product per head written straight into strided rows (oneDNN's bf16 matmul takes them)
    would skip the copy, but costs a call per head: on Zen 5 (2026-12-02) 0.25 against 0.25
    ms for stage 1's 145 windows of 3 heads, 0.59 against 0.10 ms for stage 4's 9 windows of
    24, and Swin-T's bf16 train step at 512x512 b2 took 925 against 880 ms."""
    if target.is_contiguous() and target.dtype == a.dtype:
        _product(a, b, scale, _flat(target))
        return
    out = torch.empty(target.shape, dtype=a.dtype, device=a.device)
    _product(a, b, scale, _flat(out))
    target.copy_(out)


def _product(a: Tensor, b: Tensor, scale: Optional[float], out: Tensor) -> None:
    if scale is None:
        torch.bmm(a, b, out=out)
    else:  # beta = 0: out's contents are ignored, and the scale costs no pass
        torch.baddbmm(out, a, b, beta=0, alpha=scale, out=out)


# Whether this CPU multiplies bf16 / fp16 natively (avx512_bf16, AMX, avx512_fp16): elsewhere
# oneDNN falls back to reference kernels for them, many times slower than float32 products.
NATIVE_PRODUCTS = native_products()


def backward_product_dtype(dtype: torch.dtype, device_type: str = 'cpu') -> torch.dtype:
    """The dtype of the attention backward's products for a forward in ``dtype`` on
    ``device_type``. On CPU: itself where the CPU multiplies it natively
    (:data:`NATIVE_PRODUCTS`), else float32, a fixed property of the machine, so every run on
    it computes the same. On other devices (GPUs multiply bf16/fp16 natively, and the rule
    describes this CPU, not them): the forward's dtype."""
    if device_type != 'cpu':
        return dtype
    return dtype if NATIVE_PRODUCTS.get(dtype, True) else torch.float32


@custom_op('swin_rpe::window_attention_backward', mutates_args=())
def attention_backward_op(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, bias: Tensor,
                           mask: Optional[Tensor], scale: float,
                           nw: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dbias): softmax(q k^T s + bias + mask) recomputed a chunk of one image's
    windows at a time (:func:`window_chunks`).

    Pure PyTorch on q's device (every tensor made here is made there). The batched products
    run in q's dtype (bf16 under autocast: bf16 operands, float32 accumulation, as the
    forward's kernel and autocast's own products do), on CPU only where the CPU multiplies
    that dtype natively (:func:`backward_product_dtype`; other devices always in q's dtype);
    the logits, softmax and its gradient ``ds = p * (dp - rowsum(dp * p))`` stay float32
    (float64 for float64 inputs), and ds is rounded to the product dtype only as an operand of
    dq and dk. float32 inputs compute in float32 throughout.
    """
    # Autocast off: the products run in the dtypes above whatever region backward runs in.
    with autocast_context(q.device.type):
        return _attention_backward_impl(grad_out, q, k, v, bias, mask, scale, nw)


def _attention_backward_impl(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, bias: Tensor,
                             mask: Optional[Tensor], scale: float, nw: int,
                             grad_qkv: Optional[Tensor] = None):
    """(dq, dk, dv, dbias); or dbias alone, with dq, dk and dv written into ``grad_qkv``
    ([B * nW, N, 3, heads, d], the qkv projection's layout: the packed op)."""
    dtypes = (q.dtype, k.dtype, v.dtype, bias.dtype)
    product = backward_product_dtype(q.dtype, q.device.type)
    softmax = torch.promote_types(product, torch.float32)  # float64 stays float64
    bias = bias.to(softmax)
    mask = None if mask is None else underflowing_mask(mask)  # no denormal probabilities
    bw, heads, n, head_dim = q.shape
    grad_out = grad_out.reshape(bw, n, heads, head_dim).transpose(1, 2)
    if grad_qkv is None:  # the layout batched products write without copies
        dq, dk, dv = (torch.empty(bw, heads, n, head_dim, dtype=product, device=q.device)
                      for _ in range(3))
    else:  # [B * nW, heads, N, d] views of the projection's columns
        dq, dk, dv = grad_qkv.permute(2, 0, 3, 1, 4).unbind(0)
    dbias = torch.zeros(heads, n, n, device=q.device, dtype=softmax)
    for lo, hi, chunk_mask in window_chunks(bw, nw, mask, heads, n):  # bounds the matrices
        # One pass each makes the strided views of the qkv output dense in the product's
        # dtype (q pre-scaled: dk = ds^T (q s) needs no scaling, dq = (ds k) s is scaled by
        # its product), so no product copies an operand again.
        qi = _flat(torch.mul(q[lo:hi], scale, out=torch.empty(
            hi - lo, heads, n, head_dim, dtype=product, device=q.device)))
        ki, vi, gi = (_flat(t[lo:hi].to(product, memory_format=torch.contiguous_format))
                      for t in (k, v, grad_out))
        p = image_probabilities(qi, ki, bias, chunk_mask, hi - lo)
        _products_into(dv[lo:hi], p.to(product).transpose(1, 2), gi)
        dp = torch.bmm(gi, vi.transpose(1, 2)).to(softmax)
        ds = softmax_backward_data(dp, p, -1, softmax)  # p (dp - rowsum(dp p))
        del dp, p
        dbias += ds.view(hi - lo, heads, n, n).sum(0)
        ds = ds.to(product)
        _products_into(dq[lo:hi], ds, ki, scale)
        _products_into(dk[lo:hi], ds.transpose(1, 2), qi)
    if grad_qkv is not None:
        return dbias.to(dtypes[3])
    return tuple(g.to(dt) for g, dt in zip((dq, dk, dv, dbias), dtypes))


@attention_backward_op.register_fake
def _(grad_out, q, k, v, bias, mask, scale, nw):
    # Dense [B * nW, heads, N, d] gradients as the kernel writes them, whatever q's strides.
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            bias.new_empty(bias.shape))


def qkv_views(qkv: Tensor, heads: int) -> Tuple[Tensor, Tensor, Tensor]:
    """q, k, v [B * nW, heads, N, d] as views of a qkv projection output [B * nW, N, 3C]."""
    bw, n, c3 = qkv.shape
    return qkv.view(bw, n, 3, heads, c3 // 3 // heads).permute(2, 0, 3, 1, 4).unbind(0)


@custom_op('swin_rpe::window_attention_qkv_backward', mutates_args=())
def attention_qkv_backward_op(grad_out: Tensor, qkv: Tensor, heads: int, bias: Tensor,
                               mask: Optional[Tensor], scale: float,
                               nw: int) -> Tuple[Tensor, Tensor]:
    """(dqkv, dbias) of :func:`_attention_qkv_op`: :func:`attention_backward_op`'s
    computation, with dq, dk and dv copied into the gradient of qkv (qkv's layout and dtype)
    a chunk at a time, while each is still in cache, instead of by autograd after the op."""
    bw, n, c3 = qkv.shape
    with autocast_context(qkv.device.type):
        grad = torch.empty(bw, n, 3, heads, c3 // 3 // heads, dtype=qkv.dtype,
                           device=qkv.device)
        dbias = _attention_backward_impl(grad_out, *qkv_views(qkv, heads), bias, mask, scale,
                                         nw, grad)
    return grad.view(bw, n, c3), dbias


@attention_qkv_backward_op.register_fake
def _(grad_out, qkv, heads, bias, mask, scale, nw):
    return qkv.new_empty(qkv.shape), bias.new_empty(bias.shape)
