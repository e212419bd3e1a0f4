"""The generic path (what CUDA and every other device run) on the ``meta`` device, and on CPU
against the CPU fast path.

Meta tensors have shapes, dtypes and a device but no data, so forward and backward run there
without an accelerator: a path that makes a tensor on the CPU inside forward or backward is
not device-agnostic. The meta device alone does not catch every such tensor (matmul and
index_select, for instance, accept a CPU operand next to meta ones), so the runs go under
:class:`OnlyOn`, a dispatch mode that fails on any operand or result of any op that is not on
meta, inside the bodies of the registered ops too. Window plans are the one thing built on the
CPU by design (``ops/plan.py``: moved to the device once, then cached), so the models run once
before the strict run.
"""
import contextlib
import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from swin_rpe_plugin import SwinTransformer, SwinTransformerV2, compat
from swin_rpe_plugin.ops import (attention, shift_attention_mask, window_attention,
                                 window_attention_qkv, window_plan, window_products)
from swin_rpe_plugin.ops.dispatch import force_backend

# The Python bodies the registered ops were defined with: run under the mode, so the ops'
# insides are checked too (the mode otherwise sees an op as one call).
OP_BODIES = {'swin_rpe.window_attention.default': attention._attention_op._init_fn,
             'swin_rpe.window_attention_backward.default':
                 window_products.attention_backward_op._init_fn,
             'swin_rpe.window_attention_qkv.default': attention._attention_qkv_op._init_fn,
             'swin_rpe.window_attention_qkv_backward.default':
                 window_products.attention_qkv_backward_op._init_fn}


class OnlyOn(TorchDispatchMode):
    """Fail on any op with a tensor operand or result that is not on ``device``."""

    def __init__(self, device: str):
        super().__init__()
        self.device = device
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops.add(str(func))
        body = OP_BODIES.get(str(func))
        if body is not None:
            with self:  # the mode is off inside __torch_dispatch__: back on for the body
                out = body(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        for t in tree_flatten((args, kwargs, out))[0]:  # tree_leaves: torch >= 2.2
            if isinstance(t, torch.Tensor) and t.device.type != self.device:
                raise AssertionError(f'{func} has a tensor on {t.device}, not {self.device}')
        return out


def test_the_strict_mode_catches_what_meta_lets_through():
    """The check the tests rely on: matmul on meta takes a CPU operand; the mode refuses it."""
    a, b = torch.randn(3, 3, device='meta'), torch.randn(3, 3)
    assert torch.matmul(a, b).device.type == 'meta'
    with pytest.raises(AssertionError, match='has a tensor on cpu'):
        with OnlyOn('meta'):
            torch.matmul(a, b)


B, NW, HEADS, N, HD = 2, 4, 3, 49, 8


def masks():
    shift = shift_attention_mask((14, 14), 7, 3)  # [nW=4, N, N]
    return {'none': None, 'every_window': shift, 'last3_shared': shift[1:],
            'last3_per_image': torch.stack([shift[1:], shift[1:].flip(0)])}


@pytest.mark.parametrize('packed', [False, True], ids=['qkv_views', 'packed_qkv'])
@pytest.mark.parametrize('dropout', [0.0, 0.1], ids=['recomputed', 'dropout'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16], ids=['fp32', 'bf16'])
@pytest.mark.parametrize('which', list(masks()))
def test_window_attention_forward_and_backward_on_meta(which, dtype, dropout, packed):
    """Meta has no autocast, so bf16 is given as the inputs' dtype (autocast's cast).
    ``packed``: the attention of one qkv projection output (Swin V1's), whose backward writes
    the gradient of qkv a head at a time into its layout (strided rows, as on every device)."""
    mask = masks()[which]
    mask = None if mask is None else mask.to('meta')
    if packed:
        leaves = [torch.empty(B * NW, N, 3 * HEADS * HD, device='meta', dtype=dtype,
                              requires_grad=True)]
    else:
        leaves = [torch.empty(B * NW, HEADS, N, HD, device='meta', dtype=dtype,
                              requires_grad=True) for _ in range(3)]
    bias = torch.empty(HEADS, N, N, device='meta', requires_grad=True)
    mode = OnlyOn('meta')
    with force_backend('generic'), mode:
        if packed:
            out = window_attention_qkv(*leaves, HEADS, bias, mask, dropout_p=dropout,
                                       windows_per_image=NW)
        else:
            out = window_attention(*leaves, bias, mask, dropout_p=dropout, windows_per_image=NW)
        out.float().sum().backward()
    assert (out.shape, out.device.type, out.dtype) == ((B * NW, N, HEADS * HD), 'meta', dtype)
    for t in (*leaves, bias):
        assert (t.grad.shape, t.grad.device.type, t.grad.dtype) == (t.shape, 'meta', t.dtype)
    # The generic path: autograd through SDPA, never a registered op (the CPU path's).
    assert not any(op.startswith('swin_rpe') for op in mode.ops), mode.ops


TINY = dict(embed_dims=32, depths=(2, 2), num_heads=(1, 2), strides=(4, 2), out_indices=(0, 1),
            window_size=4, mask_padding=True)


@pytest.mark.parametrize('model_class,kwargs', [
    (SwinTransformer, {}), (SwinTransformer, dict(attn_drop_rate=0.1, drop_path_rate=0.1)),
    (SwinTransformerV2, {}), (SwinTransformerV2, dict(pretrained_window_size=3))],
    ids=['v1', 'v1-dropout', 'v2', 'v2-pretrained-window'])
def test_whole_backbone_trains_on_meta(model_class, kwargs):
    """61 x 75 pixels: 16 x 19 tokens, then 8 x 10, neither a multiple of the window, so every
    stage pads, shifts and masks the padding (mask_padding=True)."""
    torch.manual_seed(0)
    model = model_class(**TINY, **kwargs).train()
    x = torch.randn(2, 3, 61, 75)
    with force_backend('generic'), torch.no_grad():
        cpu_shapes = [o.shape for o in model(x)]
    assert [tuple(s) for s in cpu_shapes] == [(2, 32, 16, 19), (2, 64, 8, 10)]
    meta = copy.deepcopy(model).to('meta')
    x = x.to('meta')
    with force_backend('generic'):
        meta(x)  # builds the window plans (on the CPU by design) and caches them on meta
        mode = OnlyOn('meta')
        with mode:
            outs = meta(x)
            sum(o.sum() for o in outs).backward()
    assert [o.shape for o in outs] == cpu_shapes
    assert all(o.device.type == 'meta' and o.dtype == torch.float32 for o in outs)
    # The generic path: autograd through SDPA, never a registered op (the CPU path's).
    assert not any(op.startswith('swin_rpe.window_attention') for op in mode.ops), mode.ops
    for name, p in meta.named_parameters():
        assert p.grad is not None, name
        assert (p.grad.shape, p.grad.device.type, p.grad.dtype) == (p.shape, 'meta', p.dtype)


def loop_reference(q, k, v, bias, full_mask, scale):
    """One window at a time, the plain formula, in float64; full_mask [B * nW, N, N]."""
    outs = []
    for i in range(q.shape[0]):
        logits = q[i] @ k[i].transpose(-1, -2) * scale + bias + full_mask[i]
        outs.append((logits.softmax(-1) @ v[i]).transpose(0, 1).reshape(q.shape[2], -1))
    return torch.stack(outs)


@pytest.mark.parametrize('valid_hw', [(10, 11), ((10, 11), (7, 9))],
                         ids=['one_region', 'per_image'])
def test_generic_equals_the_cpu_path_on_shifted_padded_windows(valid_hw):
    """The plan of a shifted block on a 10 x 11 map padded to 12 x 12, padding masked (one
    region for both images, or one per image): both paths give the float64 loop reference's
    outputs and gradients to float32 rounding, and each other's."""
    torch.manual_seed(0)  # fully masked padding rows carry float32's error at -100: fixed data
    plan = window_plan((10, 11), 4, (2, 2), valid_hw)
    nw, n, heads, hd = plan.num_windows, 16, 2, 8
    full = torch.zeros(B, nw, n, n, dtype=torch.float64)
    full[:, nw - plan.mask.shape[-3]:] = plan.mask.double()
    inputs = [torch.randn(B * nw, heads, n, hd) for _ in range(3)] + [torch.randn(heads, n, n)]
    ref_inputs = [t.double().requires_grad_() for t in inputs]
    ref = loop_reference(*ref_inputs, full.reshape(B * nw, n, n), hd ** -0.5)
    weight = torch.randn(ref.shape, dtype=torch.float64)
    ref_grads = torch.autograd.grad((ref * weight).sum(), ref_inputs)
    results = {}
    for backend in ('auto', 'generic'):
        leaves = [t.clone().requires_grad_() for t in inputs]
        with force_backend(backend):
            out = window_attention(*leaves, plan.mask, windows_per_image=nw)
        grads = torch.autograd.grad((out * weight.float()).sum(), leaves)
        results[backend] = (out, *grads)
        for got, expected in zip(results[backend], (ref, *ref_grads)):
            torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    for a, b in zip(results['auto'], results['generic']):
        torch.testing.assert_close(a, b)  # float32's default tolerances


@pytest.mark.parametrize('packed', [False, True], ids=['qkv_views', 'packed_qkv'])
@pytest.mark.parametrize('which', ['none', 'every_window', 'last3_shared', 'last3_per_image'])
def test_generic_path_is_one_sdpa_call_whatever_the_batch(which, packed, monkeypatch):
    """One SDPA call per layer for every window of every image: the bias broadcast over every
    window ([1, heads, N, N]) unmasked; with a mask, bias + mask made once per window and
    expanded over the images ([B * nW, heads, N, N], one copy: q, k and v stay views of the
    projection), and the same operators forward and backward for 2 images as for 4."""
    from benchmarks.work import WorkCounter
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, 'scaled_dot_product_attention',
                        lambda *a, **kw: calls.append(kw['attn_mask'].shape) or sdpa(*a, **kw))
    mask = masks()[which]
    ops = []
    for images in (2, 4):
        image_mask = mask if which != 'last3_per_image' else mask[[0, 1, 0, 1][:images]]
        if packed:
            leaves = [torch.randn(images * NW, N, 3 * HEADS * HD, requires_grad=True)]
        else:
            leaves = [torch.randn(images * NW, HEADS, N, HD, requires_grad=True)
                      for _ in range(3)]
        bias = torch.randn(HEADS, N, N, requires_grad=True)
        counter = WorkCounter()
        for mode in (contextlib.nullcontext(), counter):  # warm-up: the mask of every window
            with force_backend('generic'), mode:
                out = (window_attention_qkv(*leaves, HEADS, bias, image_mask,
                                            windows_per_image=NW)
                       if packed else window_attention(*leaves, bias, image_mask,
                                                       windows_per_image=NW))
                out.sum().backward()
        ops.append(counter.kernels_by_op)
    assert ops[0] == ops[1]
    assert ops[0]['constant_pad_nd'] == 0  # the mask of every window: made once, then kept
    expected = [(1, HEADS, N, N)] * 2 if mask is None else \
        [(images * NW, HEADS, N, N) for images in (2, 4)]
    assert [tuple(shape) for shape in calls] == [s for s in expected for _ in range(2)]
