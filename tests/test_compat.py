"""swin_rpe_plugin.compat: the floor, and every fallback run on whatever torch runs the tests,
checked against torch's own answer or against autograd."""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from swin_rpe_plugin import compat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_version_parsing_and_floor():
    assert compat.parse_version('2.1.2+cu121') == (2, 1)
    assert compat.parse_version('2.13.0+cpu') == (2, 13)
    assert compat.parse_version('2.15.0.dev20261101') == (2, 15)
    compat.check_torch((2, 1), '2.1.0')
    with pytest.raises(ImportError) as err:
        compat.check_torch((2, 0), '2.0.1')
    message = str(err.value)
    assert '\n' not in message and 'torch >= 2.1' in message and '2.0.1' in message


def test_import_on_an_older_torch_is_one_line_naming_the_floor():
    code = ('import torch; torch.__version__ = "2.0.1"\n'
            'try:\n    import swin_rpe_plugin\nexcept ImportError as e:\n    print(e)\n'
            'else:\n    print("imported")')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout.strip()
    assert out.splitlines() == [out] and out.startswith('swin_rpe_plugin needs torch >= 2.1')


@pytest.mark.parametrize('device_form', [True, False])
def test_autocast_queries_agree_with_autocast_itself(monkeypatch, device_form):
    """The per-device queries (torch >= 2.4) and the per-kind ones older torches have give the
    answers autocast itself acts on: the dtype of a product inside the region."""
    if device_form and not compat._HAS_DEVICE_AUTOCAST:
        device_form = False  # this torch has only the older form: both cases test it
    monkeypatch.setattr(compat, '_HAS_DEVICE_AUTOCAST', device_form)
    x = torch.randn(4, 4)
    assert not compat.autocast_enabled('cpu')
    for dtype in (torch.bfloat16, ):  # CPU autocast in torch 2.1 has bf16 alone
        with torch.autocast('cpu', dtype=dtype):
            assert compat.autocast_enabled('cpu')
            assert compat.autocast_dtype('cpu') == (x @ x).dtype == dtype
            with compat.autocast_context('cpu'):
                assert not compat.autocast_enabled('cpu') and (x @ x).dtype == torch.float32
    assert not compat.autocast_available('meta') and compat.autocast_dtype('meta') is None
    assert not compat.autocast_enabled('meta')
    with compat.autocast_context('meta'):  # nothing to switch
        pass


def test_forward_never_asks_torch_whether_a_device_has_autocast(monkeypatch):
    """Whether a device has autocast cannot change within a process, so it is read once (at
    import) and forward only looks it up: dynamo on torch 2.11 breaks its graph on
    ``torch._C._is_autocast_available`` in every block. Here our query and torch's public one
    raise (``torch.autocast`` itself asks the private one as it is entered, outside our
    code; dynamo does not trace into it), and a train step of both paths, with and without
    autocast, still runs."""
    from swin_rpe_plugin import SwinTransformer
    from swin_rpe_plugin.ops.dispatch import force_backend

    def refuse(*args, **kwargs):
        raise AssertionError('forward asked torch whether a device has autocast')

    model = SwinTransformer(embed_dims=16, depths=(2, ), num_heads=(1, ), strides=(4, ),
                            out_indices=(0, ), window_size=4).train()
    x = torch.randn(2, 3, 37, 45)
    monkeypatch.setattr(compat, '_ask_autocast_available', refuse)
    if hasattr(torch.amp, 'is_autocast_available'):
        monkeypatch.setattr(torch.amp, 'is_autocast_available', refuse)
    for backend in ('auto', 'generic'):
        for enabled in (False, True):
            with force_backend(backend), torch.autocast('cpu', torch.bfloat16, enabled=enabled):
                out = model(x)[0]
            out.float().sum().backward()


def test_softmax_backward_fallback_matches_autograd(monkeypatch):
    logits = torch.randn(3, 5, 7, dtype=torch.float64, requires_grad=True)
    p = torch.softmax(logits, -1)
    grad = torch.randn_like(p)
    expected, = torch.autograd.grad(p, logits, grad)
    assert torch.allclose(compat.softmax_backward_data(grad, p.detach(), -1, torch.float64),
                          expected, atol=1e-12)
    monkeypatch.delattr(torch, '_softmax_backward_data')
    assert torch.allclose(compat.softmax_backward_data(grad, p.detach(), -1, torch.float64),
                          expected, atol=1e-12)


def test_gradient_edge_fallback_gives_the_same_gradients(monkeypatch):
    x = torch.randn(5, 3, requires_grad=True)
    grad = torch.randn(5, 3)
    results = []
    for has_edge in (True, False):
        if not has_edge:
            monkeypatch.setattr(compat, '_GRAD_TAKES_EDGES', False)
        y = torch.tanh(x) * 2
        results.append(torch.autograd.grad(compat.gradient_edge(y), [x], grad)[0])
    expected = grad * 2 * (1 - torch.tanh(x.detach()) ** 2)
    for result in results:
        assert torch.allclose(result, expected)


# False: as this torch takes them (on torch < 2.5 that is as tensors: run once there)
_SIZE_FORMS = [True] + [False] * compat._INDUCTOR_TYPES_SIZE_EXPRESSIONS


@pytest.mark.needs('HAS_COMPILE')
@pytest.mark.parametrize('sizes_as_tensors', _SIZE_FORMS)
def test_compiled_window_plan_is_the_eager_one_at_symbolic_sizes(monkeypatch, sizes_as_tensors):
    """The traced window plan compiled with symbolic sizes (two sizes, dynamic=True): long
    indices equal to eager ones, with sizes as this torch takes them (symbolic scalars from
    2.5) and as 0-d long tensors (torch 2.1's inductor computed the former in float32)."""
    from swin_rpe_plugin.ops.plan import traceable_window_plan
    if sizes_as_tensors:  # else as this torch takes them
        monkeypatch.setattr(compat, '_INDUCTOR_TYPES_SIZE_EXPRESSIONS', False)

    def plan(x):
        hw = (x.shape[0], x.shape[1])
        p = traceable_window_plan(hw, (7, 5), (3, 2), (hw[0] - 2, hw[1] - 3), x.device)
        return p.gather, p.scatter, p.mask

    torch._dynamo.reset()
    compiled = torch.compile(plan, dynamic=True)
    for hw in [(25, 33), (13, 17)]:
        expected = plan(torch.zeros(hw))
        got = compiled(torch.zeros(hw))
        assert got[0].dtype == got[1].dtype == torch.long
        for a, b in zip(got, expected):
            assert a.dtype == b.dtype and torch.equal(a, b)


def _scaled_product(x: torch.Tensor, w: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
    return (x @ w) * scale


def _setup(ctx, inputs, output):
    x, w, scale = inputs
    ctx.save_for_backward(x, w)
    ctx.scale = scale


def _backward(ctx, grad):
    x, w = ctx.saved_tensors
    gx = grad @ w.t() * ctx.scale if ctx.needs_input_grad[0] else None
    gw = x.t() @ grad * ctx.scale if ctx.needs_input_grad[1] else None
    return gx, gw, None


def test_eager_op_runs_the_registered_backward():
    """EagerOp (what torch < 2.4 gets for a custom op): values, gradients and default
    arguments as autograd through the plain expression; no autograd node without grad."""
    op = compat.EagerOp(_scaled_product)
    assert op.register_fake(len) is len
    op.register_autograd(_backward, setup_context=_setup)
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(4, 5, dtype=torch.float64)
    for call in (lambda: op(x, w), lambda: op(x, w, scale=2.0), lambda: op(x, w=w)):
        out = call()
        assert 'function' in type(out.grad_fn).__name__.lower()
        assert torch.allclose(out, _scaled_product(x, w))
        got = torch.autograd.grad(out, [x, w], grad)
        want = torch.autograd.grad(_scaled_product(x, w), [x, w], grad)
        for g, e in zip(got, want):
            assert torch.allclose(g, e, atol=1e-12)
    with torch.no_grad():
        assert op(x, w, 3.0).grad_fn is None
    assert torch.autograd.gradcheck(lambda a, b: op(a, b, 0.5), (x, w))


def test_private_cpu_entries_have_working_fallbacks(monkeypatch):
    native = compat.native_products()
    assert set(native) == {torch.bfloat16, torch.float16}
    assert all(isinstance(v, bool) for v in native.values())
    assert compat._mkldnn_query('_no_such_query') is False
    op = compat.onednn_linear_op()
    x, w, b = torch.randn(6, 8), torch.randn(5, 8), torch.randn(5)
    if op is not None:  # oneDNN's product is F.linear's to float32 rounding
        assert torch.allclose(op(x, w, b, 'none', [], ''), F.linear(x, w, b), atol=1e-5)
    monkeypatch.setattr(torch.backends.mkldnn, 'is_available', lambda: False)
    assert compat.onednn_linear_op() is None
    assert compat.cpu_capability() in ('DEFAULT', 'NO AVX', 'AVX', 'AVX2', 'AVX512', 'ZVECTOR',
                                       'VSX', 'SVE256', 'SVE')
    monkeypatch.delattr(torch.backends.cpu, 'get_cpu_capability')
    assert compat.cpu_capability() == 'DEFAULT'


_RUN = r'''
import json, sys, torch
from swin_rpe_plugin import SwinTransformer, compat
torch.manual_seed(0)
model = SwinTransformer(embed_dims=32, depths=(2, 2), num_heads=(2, 4), window_size=7,
                        strides=(4, 2), out_indices=(0, 1), mask_padding=True)
x = torch.randn(2, 3, 61, 90, requires_grad=True)
outs = model(x)
sum((o.double() ** 2).sum() for o in outs).backward()
grads = [x.grad] + [p.grad for p in model.parameters()]
print(json.dumps({'custom_op': compat.HAS_CUSTOM_OP,
                  'outs': [o.flatten()[::97].tolist() for o in outs],
                  'grads': [g.flatten()[::89].tolist() for g in grads],
                  'sums': [g.double().abs().sum().item() for g in grads]}))
'''


def _run(eager: bool) -> dict:
    env = dict(os.environ, SWIN_RPE_EAGER_OPS='1' if eager else '0')
    out = subprocess.run([sys.executable, '-c', _RUN], capture_output=True, text=True, cwd=ROOT,
                         env=env, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_eager_fallback_of_the_real_ops_matches_the_registered_ops():
    """The whole backbone, forward and backward, with the ops registered (torch >= 2.5) and
    with the fallback older torches run (SWIN_RPE_EAGER_OPS=1): one implementation, so the same
    numbers (on a torch that registers none, both runs take the fallback)."""
    registered, eager = _run(False), _run(True)
    assert registered['custom_op'] == (hasattr(torch.library, 'custom_op')
                                       and compat.TORCH_VERSION >= (2, 5))
    assert eager['custom_op'] is False
    assert registered['outs'] == eager['outs']
    assert registered['grads'] == eager['grads']
    assert registered['sums'] == eager['sums']


def test_cpu_masked_attention_never_takes_the_math_path():
    """On every torch the CPU path's masked attention builds no SDPA math-path matrices: SDPA's
    flash kernel where it takes the mask, else (torch 2.1) the explicit chunked products, and
    their values are the explicit reference's."""
    from swin_rpe_plugin.ops import shift_attention_mask, window_attention
    torch.manual_seed(0)
    b, nw, heads, n, hd = 2, 4, 3, 49, 8
    q, k, v = (torch.randn(b * nw, heads, n, hd, requires_grad=True) for _ in range(3))
    bias = torch.randn(heads, n, n, requires_grad=True)
    mask = shift_attention_mask((14, 14), 7, 3)[1:]
    with torch.profiler.profile() as profile:
        out = window_attention(q, k, v, bias, mask, windows_per_image=nw)
    names = {e.name for e in profile.events()}
    assert 'aten::_scaled_dot_product_attention_math' not in names
    expected = window_attention(q, k, v, bias, mask, windows_per_image=nw, fused=False)
    assert torch.allclose(out, expected, atol=1e-5)


def test_the_default_exporter_is_the_one_this_torch_has(tmp_path):
    """torch >= 2.5 exports through dynamo by default; an older one through TorchScript, and
    asking it for dynamo is a one-line error naming what to use."""
    from swin_rpe_plugin.deploy import DEFAULT_EXPORTER, export_onnx
    assert DEFAULT_EXPORTER == ('dynamo' if compat.HAS_DYNAMO_EXPORTER else 'classic')
    if not compat.HAS_DYNAMO_EXPORTER:
        with pytest.raises(ValueError, match="needs torch >= 2.5") as err:
            export_onnx(torch.nn.Linear(2, 2), torch.randn(1, 2), str(tmp_path / 'x.onnx'),
                        'dynamo')
        assert '\n' not in str(err.value) and "exporter='classic'" in str(err.value)


def test_safe_load_without_an_allow_list_resolves_the_same_globals_and_no_others(
        tmp_path, monkeypatch):
    """torch < 2.4 has no add_safe_globals: safe_torch_load then unpickles through a restricted
    unpickler with torch's own weights-only globals and the mmengine allow-list. A Runner-like
    checkpoint (numpy in meta, a HistoryBuffer) loads as plain torch.load reads it; a pickle
    that calls code is refused in the words the loader reports as unsafe."""
    import pickle

    import numpy as np
    from mmengine.logging import HistoryBuffer

    from swin_rpe_plugin.checkpoint import compat as checkpoint_compat
    monkeypatch.setattr(checkpoint_compat, '_register_safe_globals', lambda: False)
    buffer = HistoryBuffer()
    buffer.update(3.0)
    saved = {'state_dict': {'w': torch.randn(3, 2), 'b': torch.ones(2).bfloat16()},
             'meta': {'epoch': np.int64(4), 'loss': np.float64(0.5), 'arr': np.arange(3)},
             'message_hub': {'loss': buffer}}
    for zipped in (True, False):
        path = tmp_path / f'runner_{zipped}.pth'
        torch.save(saved, path, _use_new_zipfile_serialization=zipped)
        loaded = checkpoint_compat.safe_torch_load(str(path))
        for key, value in saved['state_dict'].items():
            assert torch.equal(loaded['state_dict'][key], value)
        assert loaded['meta']['epoch'] == 4 and loaded['meta']['loss'] == 0.5
        assert np.array_equal(loaded['meta']['arr'], np.arange(3))
        assert loaded['message_hub']['loss'].current() == 3.0

    class Code:
        def __reduce__(self):
            return (os.system, ('true', ))

    torch.save({'x': Code()}, tmp_path / 'code.pth')
    with pytest.raises(pickle.UnpicklingError, match='Unsupported global: GLOBAL posix.system'):
        checkpoint_compat.safe_torch_load(str(tmp_path / 'code.pth'))

