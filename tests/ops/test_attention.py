import pytest
import torch

from swin_rpe_plugin.ops import shift_attention_mask, window_attention


def loop_reference(q, k, v, bias, full_mask):
    """One window at a time, the plain formula; full_mask [nW, N, N] or None."""
    bw, heads, n, hd = q.shape
    outs = []
    for i in range(bw):
        logits = q[i] @ k[i].transpose(-1, -2) * hd ** -0.5 + bias
        if full_mask is not None:
            logits = logits + full_mask[i % full_mask.shape[0]]
        outs.append((logits.softmax(-1) @ v[i]).transpose(0, 1).reshape(n, heads * hd))
    return torch.stack(outs)  # in the inputs' dtype


@pytest.mark.parametrize('fused', [True, False], ids=['sdpa', 'explicit'])
def test_attention_against_a_loop_reference(fused):
    b, nw, heads, n, hd = 2, 4, 3, 49, 8
    q, k, v = (torch.randn(b * nw, heads, n, hd) for _ in range(3))
    bias = torch.randn(heads, n, n)
    mask = shift_attention_mask((14, 14), 7, 3)
    out = window_attention(q, k, v, bias, mask, fused=fused)
    assert torch.allclose(out, loop_reference(q, k, v, bias, mask), atol=1e-5)
    out = window_attention(q, k, v, bias, None, fused=fused)
    assert torch.allclose(out, loop_reference(q, k, v, bias, None), atol=1e-5)
    # Only the last 3 windows of each image masked: the first runs with the bias alone.
    out = window_attention(q, k, v, bias, mask[1:], fused=fused, windows_per_image=nw)
    full = torch.cat([torch.zeros(1, n, n), mask[1:]])
    assert torch.allclose(out, loop_reference(q, k, v, bias, full), atol=1e-5)


@pytest.mark.parametrize('dtype', ['fp32', 'bf16-native', 'bf16-emulated'])
@pytest.mark.parametrize('kernel', ['flash', 'explicit'])
def test_cpu_attention_kernels_against_a_loop_reference(kernel, dtype, monkeypatch):
    """Both kernels of the CPU path's rule (dispatch 'attention'), on q, k, v as the block
    makes them (strided views of one qkv output), with no mask, a mask of the last windows
    and one mask per image, against the float64 loop reference on the same values. fp32:
    to float32 rounding; bf16: bf16 products (native; forced here on any CPU) or float32 ones
    (emulated), a few bf16 ulps of the largest output, far below what a wrong formula gives."""
    import swin_rpe_plugin.ops.window_products as window_products
    from swin_rpe_plugin.ops import split_qkv
    from swin_rpe_plugin.ops.dispatch import force_kernel
    monkeypatch.setitem(window_products.NATIVE_PRODUCTS, torch.bfloat16, dtype == 'bf16-native')
    b, nw, heads, n, hd = 2, 4, 3, 49, 16
    torch.manual_seed(0)
    qkv = torch.randn(b * nw, n, 3 * heads * hd)
    qkv = qkv if dtype == 'fp32' else qkv.bfloat16()
    q, k, v = split_qkv(qkv, heads)
    bias = torch.randn(heads, n, n)
    shift = shift_attention_mask((14, 14), 7, 3)
    per_image = torch.stack([shift[1:], torch.flip(shift[1:], (-1,))])  # [B, 3, N, N]
    cases = [(None, None), (shift[1:], torch.cat([torch.zeros(1, n, n), shift[1:]])),
             (per_image, None)]
    tolerance = 1e-5 if dtype == 'fp32' else 1.5e-2
    ref_q, ref_k, ref_v = (t.double() for t in (q, k, v))
    for mask, full in cases:
        with force_kernel('attention', kernel):
            out = window_attention(q, k, v, bias, mask, windows_per_image=nw)
        assert out.dtype == q.dtype and out.shape == (b * nw, n, heads * hd)
        if mask is not None and mask.dim() == 4:  # one image at a time, each its own mask
            full_per_image = [torch.cat([torch.zeros(1, n, n), m]).double() for m in mask]
            ref = torch.cat([loop_reference(ref_q[i * nw:(i + 1) * nw],
                                            ref_k[i * nw:(i + 1) * nw],
                                            ref_v[i * nw:(i + 1) * nw], bias.double(), m)
                             for i, m in enumerate(full_per_image)])
        else:
            ref = loop_reference(ref_q, ref_k, ref_v, bias.double(),
                                 None if full is None else full.double())
        err = (out.double() - ref).abs().max() / ref.abs().max()
        assert err < tolerance, (kernel, dtype, None if mask is None else mask.shape, float(err))


def test_attention_refuses_mismatched_bias_and_mask():
    q = torch.randn(4, 2, 9, 4)
    with pytest.raises(ValueError, match='bias'):
        window_attention(q, q, q, torch.zeros(3, 9, 9))
    with pytest.raises(ValueError, match='mask'):
        window_attention(q, q, q, torch.zeros(2, 9, 9), torch.zeros(3, 9, 9))
    from swin_rpe_plugin.ops import window_attention_qkv
    qkv = torch.randn(4, 9, 3 * 2 * 4)
    with pytest.raises(ValueError, match='qkv has 25 channels'):
        window_attention_qkv(torch.randn(4, 9, 25), 2, torch.zeros(2, 9, 9))
    with pytest.raises(ValueError, match='bias'):
        window_attention_qkv(qkv, 2, torch.zeros(3, 9, 9))
    with pytest.raises(ValueError, match='mask'):
        window_attention_qkv(qkv, 2, torch.zeros(2, 9, 9), torch.zeros(3, 9, 9))


@pytest.mark.parametrize('masked_windows', [0, 1, 4])
def test_recomputed_backward_matches_autograd_of_the_explicit_path(masked_windows):
    b, nw, heads, n, hd = 2, 4, 3, 49, 8
    q, k, v = (torch.randn(b * nw, heads, n, hd, requires_grad=True) for _ in range(3))
    bias = torch.randn(heads, n, n, requires_grad=True)
    mask = shift_attention_mask((14, 14), 7, 3)[nw - masked_windows:] if masked_windows else None
    grads = []
    for fused in (True, False):
        out = window_attention(q, k, v, bias, mask, fused=fused, windows_per_image=nw)
        weight = torch.linspace(-1, 1, out.numel()).view_as(out)
        grads.append(torch.autograd.grad((out * weight).sum(), (q, k, v, bias)))
    for fused_grad, explicit_grad in zip(*grads):
        assert torch.allclose(fused_grad, explicit_grad, atol=1e-5)


@pytest.mark.parametrize('packed', [False, True], ids=['qkv_views', 'packed_qkv'])
@pytest.mark.parametrize('kernel', ['flash', 'explicit'])
@pytest.mark.parametrize('native', [True, False], ids=['native-bf16', 'emulated-bf16'])
@pytest.mark.parametrize('masked_windows', [0, 4])
def test_bf16_backward_is_bf16_products_with_float32_softmax(masked_windows, native, kernel,
                                                             packed, monkeypatch):
    """bf16 q, k, v (autocast's cast): gradients in bf16 (the bias's in float32), within bf16
    rounding of float64 autograd through the loop reference on the same bf16 values. Products
    in bf16 (a CPU with native bf16; forced here on any CPU) round each operand once (2^-9
    relative): ds and p are the rounded ones, so the bound is a few bf16 ulps of the largest
    gradient, far below what a wrong formula gives. Without native bf16 they run in float32.
    ``packed``: q, k, v are columns of one qkv, which the attention takes itself; its bf16
    products then write the gradient straight into qkv's layout, one head at a time (and the
    explicit forward its output), strided rows that oneDNN takes as they are."""
    import swin_rpe_plugin.ops.window_products as window_products
    from swin_rpe_plugin.ops import split_qkv, window_attention_qkv
    from swin_rpe_plugin.ops.dispatch import force_kernel
    monkeypatch.setitem(window_products.NATIVE_PRODUCTS, torch.bfloat16, native)
    assert window_products.backward_product_dtype(torch.bfloat16) == \
        (torch.bfloat16 if native else torch.float32)
    assert window_products.backward_product_dtype(torch.float32) == torch.float32
    b, nw, heads, n, hd = 2, 4, 3, 49, 16
    torch.manual_seed(0)
    qkv = torch.randn(b * nw, n, 3 * heads * hd).bfloat16().requires_grad_()
    if packed:
        leaves = (qkv,)
        q, k, v = split_qkv(qkv, heads)
    else:
        q, k, v = leaves = tuple(t.detach().requires_grad_() for t in split_qkv(qkv, heads))
    bias = torch.randn(heads, n, n, requires_grad=True)
    mask = shift_attention_mask((14, 14), 7, 3)[nw - masked_windows:] if masked_windows else None
    with force_kernel('attention', kernel):
        if packed:
            out = window_attention_qkv(qkv, heads, bias, mask, windows_per_image=nw)
        else:
            out = window_attention(q, k, v, bias, mask, windows_per_image=nw)
    weight = torch.randn(out.shape)
    grads = torch.autograd.grad((out.float() * weight).sum(), (*leaves, bias))
    assert [g.dtype for g in grads] == [torch.bfloat16] * len(leaves) + [torch.float32]

    ref_leaves = [t.detach().double().requires_grad_() for t in (*leaves, bias)]
    ref_qkv = split_qkv(ref_leaves[0], heads) if packed else ref_leaves[:3]
    full = None if mask is None else torch.cat(
        [torch.zeros(nw - masked_windows, n, n), mask]).double()
    ref = loop_reference(*ref_qkv, ref_leaves[-1], full)
    err = (out.double() - ref).abs().max() / ref.abs().max()
    assert err < 1.5e-2, ('out', float(err))
    ref_grads = torch.autograd.grad((ref * weight.double()).sum(), ref_leaves)
    names = ['qkv'] if packed else ['q', 'k', 'v']
    for name, got, expected in zip(names + ['bias'], grads, ref_grads):
        err = (got.double() - expected).abs().max() / expected.abs().max()
        assert err < 1.5e-2, (name, float(err))


def _assert_same_values_and_gradients(out, ref, inputs):
    assert torch.allclose(out, ref)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, inputs, g)
    expected = torch.autograd.grad(ref, inputs, g)
    for a, b in zip(got, expected):
        assert torch.allclose(a, b, atol=1e-10)


def test_linear_with_recomputed_input_matches_autograd():
    from swin_rpe_plugin.ops import linear_with_recomputed_input
    norm = torch.nn.LayerNorm(6).double()
    with torch.no_grad():
        norm.weight.normal_(), norm.bias.normal_()
    weight = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(5, dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, 7, 6, dtype=torch.float64, requires_grad=True)
    prefix = lambda t: torch.nn.functional.gelu(norm(t))  # noqa: E731
    inputs = (x, weight, bias, norm.weight, norm.bias)
    out = linear_with_recomputed_input(x, prefix, list(norm.parameters()), weight, bias)
    ref = torch.nn.functional.linear(prefix(x), weight, bias)
    _assert_same_values_and_gradients(out, ref, inputs)


def test_recomputed_prefix_with_residual_matches_autograd():
    """The CPU kernels' projection path: a prefix recomputed from the kept input, the
    residual added by the product. Against plain autograd in float64."""
    from swin_rpe_plugin.ops import linear_with_recomputed_input
    gelu = torch.nn.GELU()
    weight = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(5, dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, 7, 6, dtype=torch.float64, requires_grad=True)
    residual = torch.randn(2, 7, 5, dtype=torch.float64, requires_grad=True)
    inputs = (x, weight, bias, residual)
    out = linear_with_recomputed_input(x, gelu, [], weight, bias, residual)
    ref = residual + torch.nn.functional.linear(gelu(x), weight, bias)
    _assert_same_values_and_gradients(out, ref, inputs)


@pytest.mark.needs('HAS_CUSTOM_OP')
def test_backward_fake_kernel_strides_match_the_kernel():
    """inductor asserts a registered op's output strides against its fake kernel. With q, k,
    v the strided views of a qkv projection (as SwinV2 passes them) the kernel returns dense
    gradients, and so must the fake (a mismatch failed compiled training); the packed op
    returns the gradient of qkv in qkv's layout."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from swin_rpe_plugin.ops import split_qkv
    qkv = torch.randn(8, 16, 3 * 2 * 4)
    q, k, v = split_qkv(qkv, 2)
    bias, grad = torch.randn(2, 16, 16), torch.randn(8, 16, 8)
    op = torch.ops.swin_rpe.window_attention_backward
    real = op(grad, q, k, v, bias, None, 0.5, 4)
    with FakeTensorMode() as mode:
        fake = op(*(mode.from_tensor(t) for t in (grad, q, k, v, bias)), None, 0.5, 4)
    assert [t.stride() for t in fake] == [t.stride() for t in real]
    assert [t.shape for t in fake] == [t.shape for t in real]
    packed_op = torch.ops.swin_rpe.window_attention_qkv_backward
    real = packed_op(grad, qkv, 2, bias, None, 0.5, 4)
    with FakeTensorMode() as mode:
        fake = packed_op(*(mode.from_tensor(t) for t in (grad, qkv)), 2, mode.from_tensor(bias),
                         None, 0.5, 4)
    assert [(t.shape, t.stride()) for t in fake] == [(t.shape, t.stride()) for t in real] \
        == [(qkv.shape, qkv.stride()), (bias.shape, bias.stride())]


def test_kernels_see_masks_whose_weights_underflow_to_zero_not_to_denormals():
    """exp(-100 + ...) is a float32 denormal, which Intel CPUs compute with many times slower;
    the kernels' copy of the mask doubles masked entries, so those weights are exact zeros,
    and the outputs stay the reference's to float32 rounding. The copy is made once per mask
    and made again when the mask changes in place."""
    from swin_rpe_plugin.ops.window_products import image_probabilities, underflowing_mask
    nw, heads, n, hd = 4, 2, 49, 8
    torch.manual_seed(0)
    q, k = (torch.randn(nw * heads, n, hd) for _ in range(2))
    bias = torch.randn(heads, n, n)
    mask = shift_attention_mask((14, 14), 7, 3)
    tiny = torch.finfo(torch.float32).tiny

    def denormals(p):
        return int(((p != 0) & (p.abs() < tiny)).sum())

    reference = image_probabilities(q, k, bias, mask, nw)
    assert denormals(reference) > 0  # the reference's -100: the slow case exists
    doubled = underflowing_mask(mask)
    assert set(doubled.unique().tolist()) == {0.0, -200.0}
    p = image_probabilities(q, k, bias, doubled, nw)
    assert denormals(p) == 0
    assert torch.allclose(p, reference, rtol=0, atol=1e-30)
    assert underflowing_mask(mask) is doubled  # once per mask
    mask[0, 0, 0] = -100.0  # changed in place: made again
    assert underflowing_mask(mask) is not doubled and underflowing_mask(mask)[0, 0, 0] == -200.0
    custom = torch.full((1, n, n), -3.0)  # other additive values pass unchanged
    assert torch.equal(underflowing_mask(custom), custom)
    # A query masked everywhere (padding) keeps -100: no denormals there, and -200 would only
    # add float32 rounding; a query with one unmasked key gets its masked keys doubled.
    rows = torch.zeros(1, n, n)
    rows[0, 0] = -100.0
    rows[0, 1, 1:] = -100.0
    kept = underflowing_mask(rows)
    assert torch.equal(kept[0, 0], rows[0, 0]) and kept[0, 1, 0] == 0.0
    assert torch.equal(kept[0, 1, 1:], torch.full((n - 1, ), -200.0))
    assert denormals(image_probabilities(q[:heads], k[:heads], bias, kept, 1)) == 0


@pytest.mark.needs('CPU_FLASH_TAKES_MASK')
@pytest.mark.parametrize('backend', ['auto'])
def test_training_forward_takes_the_fused_kernel_not_the_math_path(backend):
    """With a bias that requires grad (a parameter in training), SDPA's CPU kernels leave for
    its math path, which builds every attention matrix, unless the kernels get detached
    inputs; the CPU path's registered op gives the gradients itself. Its forward must run the
    fused kernel alone. (The generic path runs SDPA with autograd: GPUs' fused kernels take a
    mask that requires grad; on the CPU it is the math path.)"""
    from swin_rpe_plugin.ops.dispatch import force_backend, force_kernel
    b, nw, heads, n, hd = 2, 4, 3, 49, 8
    q, k, v = (torch.randn(b * nw, heads, n, hd, requires_grad=True) for _ in range(3))
    bias = torch.randn(heads, n, n, requires_grad=True)
    mask = shift_attention_mask((14, 14), 7, 3)[1:]
    # The profiler sees the aten ops inside the registered op (a dispatch mode sees one call).
    with force_backend(backend), force_kernel('attention', 'flash'), \
            torch.profiler.profile() as profile:
        out = window_attention(q, k, v, bias, mask, windows_per_image=nw)
    names = [e.name for e in profile.events()]
    # per image: one call for the unmasked windows, one for the masked ones
    assert names.count('aten::_scaled_dot_product_flash_attention_for_cpu') == 2 * b
    assert not {'aten::_scaled_dot_product_attention_math', 'aten::_safe_softmax',
                'aten::_softmax'} & set(names)
    assert out.requires_grad
    out.sum().backward()
    assert bias.grad is not None and q.grad is not None
