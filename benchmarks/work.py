"""Exact work of one step: product FLOPs, bytes moved outside the products (by kind), bytes kept
for backward and the allocator's peak. Counts, not timings: the same on any CPU and under any
load, so a change that adds a pass or keeps a tensor shows on every machine
(tests/benchmarks/test_work_budgets.py).

:func:`count_work` runs one step under a ``TorchDispatchMode`` that sees every aten operator,
forward and backward, under ``saved_tensors_hooks`` and the profiler's memory events. What each
operator counts (spans of views, the bias prefill of ``addmm``, oneDNN's epilogues, registered
ops, kinds by operator and shape, one thread, products' arithmetic skipped) is set out in
docs/analysis.md, "How the counter counts".
"""
import contextlib
from collections import Counter
from typing import Callable, Dict, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ['KINDS', 'WEIGHT_CASTS', 'WorkCounter', 'FusedAttentionCounts', 'count_kernels',
           'count_work',
           'side_summary']

KINDS = ('cast/copy', 'bias prefill', 'norm', 'activation', 'attention',
         'window gather/scatter', 'residual/elementwise')

WEIGHT_CASTS = 'weight casts'
_PRODUCTS = {'mm', 'addmm', 'addmm_', 'bmm', 'baddbmm', 'baddbmm_', 'addbmm', 'convolution', 'convolution_backward',
             '_linear_pointwise', '_scaled_dot_product_flash_attention_for_cpu',
             '_scaled_dot_product_flash_attention_for_cpu_backward',
             '_scaled_dot_product_efficient_attention',
             '_scaled_dot_product_efficient_attention_backward',
             '_scaled_dot_product_flash_attention', '_scaled_dot_product_flash_attention_backward'}
_BY_OP = {
    'norm': {'native_layer_norm', 'native_layer_norm_backward', 'native_group_norm',
             'native_group_norm_backward'},
    'activation': {'gelu', 'gelu_', 'gelu_backward', 'relu', 'relu_', 'threshold_backward',
                   'native_dropout', 'native_dropout_backward', 'bernoulli', 'bernoulli_'},
    'attention': {'_softmax', '_softmax_backward_data', 'masked_fill', 'masked_fill_'},
    'window gather/scatter': {'index_select', 'index', 'index_put', 'index_put_', 'index_fill',
                              'index_fill_',
                              '_index_put_impl_', 'gather', 'scatter', 'scatter_add',
                              'scatter_add_', 'index_add', 'index_add_', 'roll',
                              'embedding', 'embedding_dense_backward'},
    'cast/copy': {'_to_copy', 'copy_', 'clone', 'cat', 'stack', 'constant_pad_nd', 'fill_',
                  'zero_', 'zeros', 'zeros_like', 'ones_like', 'full', 'new_zeros',
                  'new_full', 'col2im', 'im2col'},
}
_KIND_OF_OP = {op: kind for kind, ops in _BY_OP.items() for op in ops}
# Allocations without a write, and views the schema does not mark as aliases (_unsafe_view).
_NO_TRAFFIC = {'empty', 'empty_like', 'new_empty', 'empty_strided', 'new_empty_strided',
               'arange', 'scalar_tensor', 'lift_fresh', 'detach', 'resize_', 'set_', 'alias',
               '_unsafe_view'}


def _tensor_bytes(t) -> int:
    """Bytes of memory a tensor spans: its elements, at most its storage (broadcast views)."""
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
        return 0
    size = t.element_size()
    try:
        stored = t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):
        stored = t.numel() * size
    return min(t.numel() * size, stored)


def _tensors(tree):
    return [t for t in torch.utils._pytree.tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _square(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[-1] == t.shape[-2] > 1


def _product_flops(name: str, args, out) -> int:
    """2 x multiply-adds of one product operator."""
    if name in ('mm', 'addmm', 'addmm_', '_linear_pointwise'):
        a, b = (args[1], args[2]) if name.startswith('addmm') else (args[0], args[1])
        if name == '_linear_pointwise':  # x [.., K] by weight [N, K]
            return 2 * a.numel() * b.shape[0]
        return 2 * a.shape[0] * a.shape[1] * b.shape[1]
    if name in ('bmm', 'baddbmm', 'baddbmm_', 'addbmm'):
        a, b = (args[0], args[1]) if name == 'bmm' else (args[1], args[2])
        return 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
    if name == 'convolution':
        x, w = args[0], args[1]
        return 2 * _tensors(out)[0].numel() * w[0].numel()
    if name == 'convolution_backward':  # (grad_out, input, weight, ..., output_mask)
        grad_out, w, mask = args[0], args[2], args[-1]
        return 2 * grad_out.numel() * w[0].numel() * (int(mask[0]) + int(mask[1]))
    q, k = args[0], args[1]
    if name.endswith('backward'):  # grad_out first: q, k at 1, 2
        q, k = args[1], args[2]
    per_product = 2 * q.numel() // q.shape[-1] * k.shape[-2] * q.shape[-1]
    # forward: q k^T and p v; backward: the recomputed q k^T, dv, dp, dq, dk
    return per_product * (5 if name.endswith('backward') else 2)


def _product_outside_bytes(name: str, args, kwargs, out) -> int:
    """Bytes a product operator moves besides the product (see the module docstring)."""
    if name in ('addmm', 'baddbmm', 'addmm_', 'baddbmm_') and kwargs.get('beta', 1) != 0:
        # With beta != 0 the product re-reads its output (C = beta C + A B), so the addend
        # is one more pass of the output; out of place it is first copied in (write + read).
        passes = 1 if name.endswith('_') else 2
        return passes * _tensor_bytes(_tensors(out)[0]) + (0 if passes == 1 else
                                                            _tensor_bytes(args[0]))
    if name.startswith('_scaled_dot_product'):
        if name.endswith('backward'):  # reads the statistics (and the mask where given)
            return sum(_tensor_bytes(t) for t in _tensors(args[4:]))
        mask = kwargs.get('attn_mask', args[3] if len(args) > 3 else None)
        stats = _tensors(out)[1:2]  # logsumexp
        return _tensor_bytes(mask) + sum(_tensor_bytes(t) for t in stats)
    return 0


class WorkCounter(TorchDispatchMode):
    """Counts product FLOPs and bytes moved outside the products of every aten operator run
    inside it (forward and backward); ``swin_rpe::`` ops are counted through their Python
    implementations. ``by_op`` keeps the bytes per operator name for profiles.

    ``kernels``: the aten operators that launch work (a product or a pass over memory; not a
    view, an allocation or a registered op's own frame, whose aten calls count instead), what a
    GPU pays a launch for each; ``kernels_by_op`` per operator name."""

    def __init__(self, skip_products: bool = False):
        super().__init__()
        self.skip_products = skip_products
        self.product_flops = 0
        self.bytes_by_kind: Counter = Counter({kind: 0 for kind in KINDS})
        self.by_op: Counter = Counter()
        self.flops_by_op: Counter = Counter()
        self.kernels = 0
        self.kernels_by_op: Counter = Counter()

    paused = False  # set by FusedAttentionCounts while a fused call runs uncounted

    def count(self, name: str, kernels: int = 1) -> None:
        self.kernels += kernels
        self.kernels_by_op[name] += kernels

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.paused:
            return func(*args, **kwargs)
        if func.namespace == 'swin_rpe':
            from torch._library.custom_ops import OPDEFS
            opdef = OPDEFS[func._schema.name]
            with self:  # the op's own aten calls are what runs
                return opdef._init_fn(*args, **kwargs)
        name = func._schema.name.split('::')[-1]
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(),
                                                          'CompositeImplicitAutograd'):
            with self:  # e.g. matmul(out=): the products and copies it is made of
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        if self.skip_products and name in _SKIPPABLE:
            out = _unwritten(func, args, kwargs)
        else:
            out = func(*args, **kwargs)
        if not (name in _NO_TRAFFIC or _is_view(func)):
            self.kernels += 1
            self.kernels_by_op[name] += 1
        if name == '_linear_pointwise' and func._overloadname == 'binary':
            # (x, other, weight, bias, attr): the epilogue reads ``other`` as it writes
            flops = _product_flops(name, (args[0], *args[2:]), out)
            self.product_flops += flops
            self.flops_by_op[name] += flops
            moved, kind = _tensor_bytes(args[1]), 'residual/elementwise'
        elif name in _PRODUCTS:
            flops = _product_flops(name, args, out)
            self.product_flops += flops
            self.flops_by_op[name] += flops
            moved = _product_outside_bytes(name, args, kwargs, out)
            kind = 'bias prefill' if 'addmm' in name or 'baddbmm' in name else 'attention'
        elif name in _NO_TRAFFIC or _is_view(func):
            return out
        elif name in ('index_fill', 'index_fill_'):  # reads the index, writes the slices it names
            moved, kind = _index_fill_bytes(name, args), 'window gather/scatter'
        else:
            # copy_, fill_ and zero_ overwrite their destination without reading it
            operands = args[1:] if name in _OVERWRITES else args
            # out arguments (``out``, ``grad_input``, ...) are written, not read
            written = {a.name for a in func._schema.arguments if a.is_out}
            reads = _tensors(operands) + _tensors({k: v for k, v in kwargs.items()
                                                   if k not in written})
            moved = sum(_tensor_bytes(t) for t in reads + _tensors(out))
            kind = _KIND_OF_OP.get(name)
            if kind is None or (kind == 'cast/copy' and any(map(_square, reads))):
                kind = 'attention' if any(map(_square, reads + _tensors(out))) \
                    else 'residual/elementwise'
            cast = _reduction_cast_bytes(name, args, kwargs)
            if cast:
                self.bytes_by_kind['cast/copy'] += cast
                self.by_op[f'{name} (cast/copy)'] += cast
        if moved:
            self.bytes_by_kind[kind] += moved
            self.by_op[f'{name} ({kind})'] += moved
        return out


_SKIPPABLE = {'mm', 'addmm', 'addmm_', 'bmm', 'baddbmm', 'baddbmm_'}
_OVERWRITES = {'copy_', 'fill_', 'zero_'}


def _index_fill_bytes(name: str, args) -> int:
    """index_fill(x, dim, index, value): the index and the slices of x it names, written; out
    of place, x is first copied (read and written) as well."""
    x, dim, index = args[0], args[1], args[2]
    slices = x.numel() // max(x.shape[dim], 1) * index.numel() * x.element_size()
    return _tensor_bytes(index) + slices + (0 if name.endswith('_') else 2 * _tensor_bytes(x))


def _reduction_cast_bytes(name: str, args, kwargs) -> int:
    """A sum or mean asked for another dtype than its input's casts the whole input to it
    first (ATen's CPU reductions; the profiler shows the ``aten::to`` inside ``aten::sum``):
    one more pass, read and written, that the op's own operands do not show."""
    dtype = kwargs.get('dtype')
    if name not in ('sum', 'mean') or dtype is None or not args \
            or not isinstance(args[0], torch.Tensor) or args[0].dtype == dtype:
        return 0
    x = args[0]
    return _tensor_bytes(x) + x.numel() * dtype.itemsize


def _unwritten(func, args, kwargs):
    """What ``func`` returns, allocated as its kernel would allocate it, arithmetic skipped:
    the shapes and strides come from the op's meta kernel."""
    if 'out' in kwargs:
        return kwargs['out']
    if func._schema.name.endswith('_') or func._schema.returns[0].alias_info is not None:
        return args[0]  # in place (addmm_, baddbmm_)
    to_meta = lambda t: t.to('meta') if isinstance(t, torch.Tensor) else t  # noqa: E731
    meta = func(*torch.utils._pytree.tree_map(to_meta, args),
                **torch.utils._pytree.tree_map(to_meta, kwargs))
    device = next(t.device for t in _tensors(args))
    return torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype, device=device)


def _is_view(func) -> bool:
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write
                                 for r in returns)


@contextlib.contextmanager
def _saved_storages(exclude: set, param_shapes: set):
    """Collects {storage pointer: (bytes, what made it)} of every tensor autograd keeps,
    parameters excluded; 'what made it' is the producing autograd node and the dtype, or
    'weight cast' for a tensor of a parameter's shape in another dtype (autocast's casts)."""
    saved: Dict[int, tuple] = {}

    def pack(t):
        # What the forward keeps: tensors saved while backward runs (a recomputed prefix's
        # own graph) are transient, and their storages may reuse freed addresses.
        in_backward = torch._C._current_graph_task_id() != -1
        if t.layout == torch.strided and t.device.type != 'meta' and not in_backward:
            storage = t.untyped_storage()
            if storage.data_ptr() not in exclude and storage.data_ptr() not in saved:
                if (tuple(t.shape), t.dtype) in param_shapes:
                    maker = WEIGHT_CASTS
                else:
                    maker = type(t.grad_fn).__name__ if t.grad_fn is not None else 'no grad_fn'
                    maker = f'{maker} {t.dtype}'[:60]
                saved[storage.data_ptr()] = (storage.nbytes(), maker)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield saved


def _allocator_peak(prof) -> int:
    """Peak of the running sum of the profiler's allocation events (bytes)."""
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == '[memory]']
    # start_ns: torch >= 2.2; 2.1 has microseconds only (a stable sort keeps same-tick order)
    events.sort(key=lambda e: e.start_ns() if hasattr(e, 'start_ns') else e.start_us() * 1000)
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak


class _FusedAttention(torch.autograd.Function):
    """SDPA run uncounted and counted as the aten ops a CUDA device dispatches for it: the
    memory-efficient kernel (the one that takes an additive mask), after a pad of a mask whose
    rows are not 8-aligned (N = 49), and its backward kernel, then the sum of the mask's
    gradient over the batch it was broadcast over. The CPU and meta devices run SDPA with a
    mask that requires grad as its math path (~13 aten ops a call, forward and backward)."""

    @staticmethod
    def forward(ctx, mode, kwargs, q, k, v, mask):
        with mode.uncounted():
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                   **kwargs)
        mode.counter.count('_scaled_dot_product_efficient_attention')
        if mask is not None and mask.shape[-1] % 8:
            mode.counter.count('constant_pad_nd')
        ctx.mode, ctx.kwargs = mode, kwargs
        ctx.save_for_backward(q, k, v, mask)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, mask = ctx.saved_tensors
        leaves = [None if t is None else t.detach().requires_grad_(need)
                  for t, need in zip((q, k, v, mask), ctx.needs_input_grad[2:])]
        wanted = [t for t in leaves if t is not None and t.requires_grad]
        with ctx.mode.uncounted(), torch.enable_grad():
            out = torch.nn.functional.scaled_dot_product_attention(
                *leaves[:3], attn_mask=leaves[3], **ctx.kwargs)
            grads = iter(torch.autograd.grad(out, wanted, grad))
        ctx.mode.counter.count('_scaled_dot_product_efficient_attention_backward')
        if mask is not None and ctx.needs_input_grad[5] and mask.shape[0] < q.shape[0]:
            ctx.mode.counter.count('sum')
        return (None, None, *[next(grads) if t is not None and t.requires_grad else None
                              for t in leaves])


class FusedAttentionCounts(TorchFunctionMode):
    """Inside a :class:`WorkCounter`: every ``F.scaled_dot_product_attention`` call counted
    as the fused call a GPU makes (:class:`_FusedAttention`), whatever this device runs."""

    def __init__(self, counter: WorkCounter):
        super().__init__()
        self.counter = counter
        self._off = False

    @contextlib.contextmanager
    def uncounted(self):
        previous = self._off, self.counter.paused
        self._off = self.counter.paused = True
        try:
            yield
        finally:
            self._off, self.counter.paused = previous

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is not torch.nn.functional.scaled_dot_product_attention or self._off:
            return func(*args, **kwargs)
        q, k, v = args[:3]
        mask = kwargs.pop('attn_mask', args[3] if len(args) > 3 else None)
        kwargs.update(zip(('dropout_p', 'is_causal', 'scale'), args[4:]))
        return _FusedAttention.apply(self, kwargs, q, k, v, mask)


def count_kernels(step: Callable, x, fused_attention: bool = True
                  ) -> Tuple[int, Dict[str, int]]:
    """(kernels, kernels per operator name) of ``step(x)`` after one warm-up call: the aten
    operators that launch work (:class:`WorkCounter`), products' arithmetic skipped. On the
    ``meta`` device (shapes, no data) it counts the same ops as any device, at any input size,
    in a moment. ``fused_attention``: SDPA counted as a GPU's fused call
    (:class:`FusedAttentionCounts`), not as this device's math path."""
    step(x)  # warm-up: window plans built and cached, as on a device after the first step
    counter = WorkCounter(skip_products=True)
    with counter, (FusedAttentionCounts(counter) if fused_attention
                   else contextlib.nullcontext()):
        step(x)
    return counter.kernels, dict(counter.kernels_by_op.most_common())


def count_work(step: Callable, x, model: Optional[torch.nn.Module] = None,
               backward: bool = False, skip_products: bool = True,
               launches: bool = True) -> dict:
    """Exact work of ``step(x)``, after one warm-up call (counted and dropped), at one thread.

    Args:
        step: one inference or train step (forward + backward inside it).
        model: whose parameters are excluded from the kept bytes.
        backward: whether the step trains (the kept bytes are then counted).
        skip_products: skip the products' arithmetic in the counted call (see above).
        launches: count the kernels a GPU launches (:func:`count_kernels`; None without).
            Not for checkpointed models: activation checkpointing recomputes the forward
            inside backward, where the torch-function mode that counts SDPA as one fused call
            is not active, so the recomputed SDPA keeps other tensors than the forward's and
            checkpoint refuses them.

    Returns:
        dict(kernels (:func:`count_kernels`), kernels_by_op, product_flops, bytes_outside,
        bytes_by_kind, saved_bytes (None unless backward), peak_bytes, by_op, saved_by: bytes
        kept per producer and dtype).
    """
    from torch.profiler import ProfilerActivity, profile
    params = {p.untyped_storage().data_ptr() for p in model.parameters()} if model else set()
    param_shapes = {(tuple(p.shape), dtype) for p in (model.parameters() if model else ())
                    for dtype in (torch.bfloat16, torch.float16) if p.dim() >= 2} | \
        {(tuple(p.t().shape), dtype) for p in (model.parameters() if model else ())
         for dtype in (torch.bfloat16, torch.float16) if p.dim() == 2}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with WorkCounter(skip_products):  # warm-up: fills the caches, its counts dropped
            step(x)
        counter = WorkCounter(skip_products)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, \
                _saved_storages(params, param_shapes) as saved, counter:
            step(x)
    finally:
        torch.set_num_threads(threads)
    by_kind = dict(counter.bytes_by_kind)
    saved_by: Counter = Counter()
    for nbytes, maker in saved.values():
        saved_by[maker] += nbytes
    # Kernels as a GPU launches them (SDPA one fused call), from a step of their own: the
    # step above keeps what this device's SDPA keeps, for the bytes and the peak.
    kernels, kernels_by_op = count_kernels(step, x) if launches else (None, {})
    return dict(kernels=kernels, kernels_by_op=kernels_by_op,
                product_flops=counter.product_flops, bytes_outside=sum(by_kind.values()),
                bytes_by_kind=by_kind,
                saved_bytes=sum(saved_by.values()) if backward else None,
                saved_weight_cast_bytes=saved_by.get(WEIGHT_CASTS, 0) if backward else None,
                peak_bytes=_allocator_peak(prof), by_op=dict(counter.by_op.most_common()),
                saved_by=dict(saved_by.most_common()))


def side_summary(work: dict) -> dict:
    """The JSON fields of one side (the per-operator and per-producer profiles dropped)."""
    return {k: v for k, v in work.items() if k not in ('by_op', 'saved_by', 'kernels_by_op')}

