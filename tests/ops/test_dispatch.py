"""The generic (device-neutral) path against the CPU fast path and a loop reference.

The generic path is what CUDA and every other device run; forcing it on CPU tests it here.
"""
import pytest
import torch

from swin_rpe_plugin import compat
from swin_rpe_plugin.ops import (linear, shift_attention_mask, split_qkv, window_attention,
                                 window_attention_qkv)
from swin_rpe_plugin.ops.dispatch import backend, force_backend, use_cpu_fast_paths



def test_force_backend_switches_and_restores(monkeypatch):
    x = torch.zeros(1)
    monkeypatch.delenv('SWIN_RPE_BACKEND', raising=False)
    assert backend() == 'auto' and use_cpu_fast_paths(x)
    with force_backend('generic'):
        assert backend() == 'generic' and not use_cpu_fast_paths(x)
    assert use_cpu_fast_paths(x)
    monkeypatch.setenv('SWIN_RPE_BACKEND', 'generic')
    assert not use_cpu_fast_paths(x)
    monkeypatch.setenv('SWIN_RPE_BACKEND', 'cuda-please')
    with pytest.raises(ValueError, match='SWIN_RPE_BACKEND'):
        backend()
    with pytest.raises(ValueError, match='backend must be one of'):
        with force_backend('fast'):
            pass


def _masks(nw, n):
    shift = shift_attention_mask((14, 14), 7, 3)  # [4, 49, 49]
    per_image = torch.stack([shift[1:], shift[1:].flip(0)])  # [B=2, nM=3, N, N]
    return {'none': None, 'all': shift, 'last3': shift[1:], 'per_image': per_image}


@pytest.mark.parametrize('which', ['none', 'all', 'last3', 'per_image'])
def test_generic_attention_values_and_gradients_match_the_loop_reference(which):
    def run(q, k, v, bias, mask, nw):
        with force_backend('generic'):
            return window_attention(q, k, v, bias, mask, windows_per_image=nw)

    check_against_the_loop_reference(which, run)


@pytest.mark.parametrize('which', ['none', 'all', 'last3', 'per_image'])
def test_generic_path_matches_the_loop_reference_under_a_tracer_too(which, monkeypatch):
    """The generic path runs the same ops eagerly and under tracers and compilers (one SDPA
    call, bias + mask per window expanded over the images); here as a tracer sees it: the mask
    padded in the graph, not read from the eager cache."""
    from swin_rpe_plugin.ops import attention
    monkeypatch.setattr(attention, 'is_tracing', lambda x: True)
    check_against_the_loop_reference(
        which, lambda q, k, v, bias, mask, nw: attention.generic_window_attention(
            q, k, v, bias, mask, 8 ** -0.5, 0.0, nw))


@pytest.mark.parametrize('packed', [False, True], ids=['qkv_views', 'packed_qkv'])
@pytest.mark.parametrize('which', ['none', 'all', 'last3', 'per_image'])
@pytest.mark.parametrize('path', ['generic', 'cpu-explicit', 'cpu-flash'])
def test_chunks_of_an_images_windows_match_the_loop_reference(which, path, packed,
                                                              monkeypatch):
    """The recomputed backward (both paths) and the explicit forward run a chunk of one
    image's windows at a time. Chunks of 3 windows here split each image's 4 ([0, 3) and
    [3, 4)), so a mask of the last windows falls across chunks: values and gradients are
    still the float64 loop reference's, on q, k, v views and on the packed qkv projection
    (whose backward writes its gradient in its layout, a product per head or one copy)."""
    import swin_rpe_plugin.ops.window_products as window_products
    from swin_rpe_plugin.ops.dispatch import force_kernel
    monkeypatch.setattr(window_products, 'CHUNK_ELEMENTS', 3 * 3 * 49 * 49)  # heads 3, N 49
    assert [(lo, hi) for lo, hi, _ in window_products.window_chunks(8, 4, None, 3, 49)] == \
        [(0, 3), (3, 4), (4, 7), (7, 8)]

    def run(q, k, v, bias, mask, nw):
        with force_backend('generic' if path == 'generic' else 'auto'), \
                force_kernel('attention', path.split('-')[-1] if '-' in path else 'flash'):
            if packed:  # q, k, v are views of one qkv: the attention takes qkv itself
                return window_attention_qkv(q._base_qkv, 3, bias, mask, windows_per_image=nw)
            return window_attention(q, k, v, bias, mask, windows_per_image=nw)

    check_against_the_loop_reference(which, run, packed)


def check_against_the_loop_reference(which, run, packed=False):
    """``packed``: q, k, v are views of one qkv projection output, the leaf (its gradient is
    compared as the reference's q, k, v gradients in its layout)."""
    b, nw, heads, n, hd = 2, 4, 3, 49, 8
    mask = _masks(nw, n)[which]
    if packed:
        qkv = torch.randn(b * nw, n, 3 * heads * hd, dtype=torch.float64, requires_grad=True)
        q, k, v = split_qkv(qkv, heads)
        q._base_qkv = qkv
    else:
        q, k, v = (torch.randn(b * nw, heads, n, hd, dtype=torch.float64, requires_grad=True)
                   for _ in range(3))
    leaves = (qkv, ) if packed else (q, k, v)
    bias = torch.randn(heads, n, n, dtype=torch.float64, requires_grad=True)
    if mask is None:
        full = None
    else:
        m = mask.double() if mask.dim() == 4 else mask.double().expand(b, -1, -1, -1)
        full = torch.cat([torch.zeros(b, nw - m.shape[1], n, n, dtype=torch.float64), m], 1)
        full = full.reshape(b * nw, n, n)
    ref = loop_reference(q, k, v, bias, full).double()
    weight = torch.randn_like(ref)
    ref_grads = torch.autograd.grad((ref * weight).sum(), (*leaves, bias))
    out = run(q, k, v, bias, None if mask is None else mask.double(), nw)
    assert torch.allclose(out, ref, atol=1e-10)
    grads = torch.autograd.grad((out * weight).sum(), (*leaves, bias))
    names = ['qkv'] if packed else ['q', 'k', 'v']
    for name, got, expected in zip(names + ['bias'], grads, ref_grads):
        assert torch.allclose(got, expected, atol=1e-9), name


def loop_reference(q, k, v, bias, full_mask):
    """One window at a time, the plain formula; full_mask [B * nW, N, N] or None."""
    bw, heads, n, hd = q.shape
    outs = []
    for i in range(bw):
        logits = q[i] @ k[i].transpose(-1, -2) * hd ** -0.5 + bias
        if full_mask is not None:
            logits = logits + full_mask[i]
        outs.append((logits.softmax(-1) @ v[i]).transpose(0, 1).reshape(n, heads * hd))
    return torch.stack(outs)


def test_generic_linear_is_plain_f_linear():
    x, w, b = torch.randn(3, 5, 8), torch.randn(6, 8), torch.randn(6)
    with force_backend('generic'):
        out = linear(x, w, b, gelu=True)
    assert torch.equal(out, torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b)))


def test_kernel_choice_is_a_fixed_rule_and_can_be_forced(monkeypatch):
    """No timing: the same (device, dtype, CPU class) always gets the same kernel, whatever
    the shape. Every class is checked here, whichever CPU runs the test."""
    import swin_rpe_plugin.ops.dispatch as dispatch
    from swin_rpe_plugin.ops.dispatch import choose_kernel, force_kernel
    monkeypatch.delenv('SWIN_RPE_LINEAR', raising=False)
    assert not hasattr(dispatch, 'time')  # nothing in the dispatch point reads a clock
    fp32, bf16 = torch.float32, torch.bfloat16
    expected = {('amd-avx512', fp32): 'onednn', ('amd-avx512', bf16): 'onednn',
                ('intel-avx512', fp32): 'mkl', ('intel-avx512', bf16): 'mkl',
                ('amd-avx2', fp32): 'mkl', ('amd-avx2', bf16): 'mkl',
                ('intel-avx2', fp32): 'mkl', ('other-avx2', fp32): 'mkl'}
    for (cpu, dtype), kernel in expected.items():
        assert choose_kernel('linear', 'cpu', dtype, cpu) == kernel, (cpu, dtype)
    assert choose_kernel('linear', 'cuda', fp32) == 'mkl'  # the standard path: F.linear
    # This machine's: the rule for its class, the same in every call.
    assert choose_kernel('linear', 'cpu', fp32) == \
        choose_kernel('linear', 'cpu', fp32, dispatch.CPU_CLASS)
    with force_kernel('linear', 'mkl'):
        assert choose_kernel('linear', 'cpu', fp32, 'amd-avx512') == 'mkl'
    with force_kernel('linear', 'onednn'):
        assert choose_kernel('linear', 'cpu', fp32, 'amd-avx2') == 'onednn'
    # fc1 + GELU at inference: oneDNN's epilogue on AVX-512, MKL and a GELU pass on AVX2 (where
    # oneDNN's GELU epilogue was the slower one on Zen 3).
    for cpu in ('amd-avx512', 'intel-avx512', 'other-avx512', 'amd-avx2', 'intel-avx2',
                'other-avx2'):
        for dtype in (fp32, bf16):
            assert choose_kernel('linear_gelu', 'cpu', dtype, cpu) == \
                ('onednn' if cpu.endswith('avx512') else 'mkl'), (cpu, dtype)
    # The attention forward: flash everywhere but bf16 on AMD AVX-512 (Zen 5's measurement),
    # where this torch's flash kernel takes the float32 mask at all (not torch 2.1's).
    flash_fp32 = compat.CPU_FLASH_TAKES_MASK
    flash_bf16 = flash_fp32 and compat.SDPA_TAKES_FLOAT_MASK
    for cpu in ('amd-avx512', 'intel-avx512', 'amd-avx2', 'intel-avx2', 'other-avx512'):
        assert choose_kernel('attention', 'cpu', fp32, cpu) == \
            ('flash' if flash_fp32 else 'explicit')
        assert choose_kernel('attention', 'cpu', bf16, cpu) == \
            ('explicit' if cpu == 'amd-avx512' or not flash_bf16 else 'flash')
    monkeypatch.setenv('SWIN_RPE_LINEAR', 'mkl')
    assert choose_kernel('linear', 'cpu', torch.float32) == 'mkl'
    monkeypatch.setenv('SWIN_RPE_LINEAR', 'blas')
    with pytest.raises(ValueError, match="SWIN_RPE_LINEAR='blas' is not one of"):
        choose_kernel('linear', 'cpu', torch.float32)


@pytest.mark.parametrize('kernel', ['onednn', 'mkl'])
def test_forced_kernel_serves_every_product(kernel, monkeypatch):
    """The forced library computes the forward product and the input gradient."""
    from swin_rpe_plugin.ops.dispatch import force_kernel
    import importlib
    linear_mod = importlib.import_module('swin_rpe_plugin.ops.linear')
    calls = []
    real = linear_mod._onednn
    monkeypatch.setattr(linear_mod, '_onednn', lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.randn(2, 7, 16, requires_grad=True)
    w = torch.randn(24, 16, requires_grad=True)
    with force_kernel('linear', kernel):
        linear(x, w).sum().backward()
    assert len(calls) == (2 if kernel == 'onednn' else 0)


@pytest.mark.harness
@pytest.mark.harness  # counted by benchmarks/work.py
@pytest.mark.parametrize('kernel', ['onednn', 'mkl'])
def test_linear_residual_adds_inside_the_product_on_either_library(kernel):
    """residual + F.linear(x, w, b), values and gradients, with the residual added by the
    product: oneDNN's epilogue reads it once as the output is written; MKL's addmm_
    accumulates into bias + residual (one pass to make the sum, one for the product's re-read).
    Counted exactly: nothing else moves."""
    from benchmarks.work import count_work
    from swin_rpe_plugin.ops import linear_residual
    from swin_rpe_plugin.ops.dispatch import force_kernel
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 49, 32), torch.randn(24, 32), torch.randn(24)
    residual = torch.randn(2, 49, 24)
    leaves = [t.clone().requires_grad_() for t in (x, w, b, residual)]
    with force_kernel('linear', kernel):
        out = linear_residual(*leaves[:3], leaves[3])
        with torch.no_grad():
            work = count_work(lambda r: linear_residual(x, w, b, r), residual)
    reference = [t.clone().requires_grad_() for t in (x, w, b, residual)]
    expected = reference[3] + torch.nn.functional.linear(*reference[:3])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad)
    for ours, ref in zip(leaves, reference):
        torch.testing.assert_close(ours.grad, ref.grad, atol=1e-4, rtol=1e-5)
    size = residual.numel() * 4
    moved = size if kernel == 'onednn' else 3 * size + b.numel() * 4
    assert work['bytes_outside'] == moved, work['bytes_by_kind']
    assert work['product_flops'] == 2 * x.numel() * w.shape[0]


@pytest.mark.parametrize('grad', [False, True])
def test_bf16_linear_runs_on_any_cpu(grad):
    """oneDNN's bf16 inner product exists only with native bf16; elsewhere F.linear serves it.
    Either way the result is autocast's own bf16 product to bf16 rounding."""
    x = torch.randn(3, 50, 96, requires_grad=grad)
    w, b = torch.randn(288, 96, requires_grad=grad), torch.randn(288)
    with torch.set_grad_enabled(grad), torch.autocast('cpu', dtype=torch.bfloat16):
        ours = linear(x, w, b)
        reference = torch.nn.functional.linear(x, w, b)
    assert ours.dtype == reference.dtype == torch.bfloat16
    scale = reference.float().abs().max()
    assert ((ours.float() - reference.float()).abs().max() / scale) < 2 ** -7
    if grad:
        ours.float().sum().backward()
        assert x.grad is not None and torch.isfinite(x.grad).all()


def test_cpu_class_is_vendor_and_aten_capability():
    """The class names the vendor (/proc/cpuinfo) and ATen's own CPU capability (what
    ATEN_CPU_CAPABILITY sets)."""
    import swin_rpe_plugin.ops.dispatch as dispatch
    for vendor, capability, cpu in (('AuthenticAMD', 'AVX512', 'amd-avx512'),
                                    ('GenuineIntel', 'AVX512_BF16', 'intel-avx512'),
                                    ('AuthenticAMD', 'AVX2', 'amd-avx2'),
                                    ('', 'DEFAULT', 'other-avx2')):
        assert dispatch.cpu_class(vendor, capability) == cpu
    assert dispatch.CPU_CLASS == dispatch.cpu_class(
        dispatch._vendor_id(), torch.backends.cpu.get_cpu_capability())
