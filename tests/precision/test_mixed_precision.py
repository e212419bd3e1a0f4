"""Mixed precision: right under bf16 autocast whatever the CPU, and each part in its dtype.

References are independent of the code under test: float32 convolution for the patch
embedding, float32 products of bf16-rounded operands for linears and attention, and our own
float32 backbone for the bf16 backbone (its float32 parity with mmdet is tested elsewhere).
"""
import pytest
import torch
import torch.nn.functional as F

from swin_rpe_plugin import SwinTransformer
from swin_rpe_plugin.models.layers import PatchEmbed
from swin_rpe_plugin.ops import linear, shift_attention_mask, window_attention
from swin_rpe_plugin.ops.dispatch import force_backend, force_kernel

# Relative error bounds, max |bf16 - fp32| / max |fp32| (worst output or parameter), at twice
# the largest value measured on an Intel Xeon with AMX (torch 2.13): outputs 0.015 over the
# sizes below, both backends, with and without mask_padding; gradients 0.022.
BF16_BACKBONE_REL_ERR = 0.03
BF16_GRAD_REL_ERR = 0.05
# Thin and tiny inputs (1-8 px on a side, both orientations): one-column patch grids are
# where oneDNN's bf16 convolution fails on AMX CPUs.
THIN_AND_TINY = [(64, 4), (4, 64), (410, 2), (2, 410), (1, 1), (8, 3), (3, 8), (61, 4)]


def bf16():
    return torch.autocast('cpu', dtype=torch.bfloat16)


def rel_err(out, ref):
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


@pytest.mark.parametrize('hw', THIN_AND_TINY + [(97, 131)])
def test_patch_embed_is_the_float32_conv_even_under_autocast(hw):
    embed = PatchEmbed(3, 16, (4, 4), None)
    with torch.no_grad():
        embed.projection.bias.normal_()
    x = torch.randn(2, 3, *hw)
    pad_h, pad_w = -hw[0] % 4, -hw[1] % 4
    ref = F.conv2d(F.pad(x, (0, pad_w, 0, pad_h)), embed.projection.weight,
                   embed.projection.bias, stride=4)
    for context in (torch.autocast('cpu', enabled=False), bf16()):
        with context:
            out, grid = embed(x)
        assert out.dtype == torch.float32
        assert grid == tuple(ref.shape[2:])
        assert torch.allclose(out, ref.flatten(2).transpose(1, 2), atol=1e-5)


@pytest.mark.parametrize('backend', ['auto', 'generic'])
def test_linear_under_autocast_is_a_bf16_product(backend):
    x, w, b = torch.randn(7, 48), torch.randn(24, 48), torch.randn(24)
    ref = F.linear(x.bfloat16().float(), w.bfloat16().float(), b.bfloat16().float())
    with force_backend(backend), bf16():
        out = linear(x, w, b)
    assert out.dtype == torch.bfloat16
    # Products of bf16 operands summed in float32, then rounded to bf16 once (2^-8 relative).
    assert torch.allclose(out.float(), ref, rtol=2**-8, atol=1e-3)


@pytest.mark.needs('SDPA_TAKES_FLOAT_MASK')  # torch 2.1: the mask in q's dtype, or explicit
@pytest.mark.parametrize('backend', ['auto', 'generic'])
def test_attention_under_autocast_keeps_the_mask_float32_where_the_kernel_takes_it(
        backend, monkeypatch):
    b, nw, heads, n, hd = 2, 4, 2, 49, 8
    q, k, v = (torch.randn(b * nw, heads, n, hd) for _ in range(3))
    bias = torch.randn(heads, n, n)
    mask = shift_attention_mask((14, 14), 7, 3)
    seen = []
    sdpa = F.scaled_dot_product_attention

    def recording_sdpa(q, k, v, attn_mask=None, **kwargs):
        seen.append(attn_mask.dtype)
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(F, 'scaled_dot_product_attention', recording_sdpa)
    # The CPU path's SDPA kernel (its rule's other kernel, explicit products, calls no SDPA).
    with force_backend(backend), bf16(), force_kernel('attention', 'flash'):
        out = window_attention(q, k, v, bias, mask, windows_per_image=nw)
    # CPU fast path: bias + mask in float32 next to bf16 q (cast by us, autocast off); generic
    # path: autocast casts q, k, v at the call, the mask is passed in its dtype (what CUDA's
    # kernels take).
    expected_mask = torch.float32 if backend == 'auto' else torch.bfloat16
    assert seen and all(d == expected_mask for d in seen)
    qb, kb, vb = (t.bfloat16().float() for t in (q, k, v))
    logits = qb @ kb.transpose(-1, -2) * hd ** -0.5 + bias + mask.repeat(b, 1, 1)[:, None]
    ref = (logits.softmax(-1) @ vb).transpose(1, 2).reshape(b * nw, n, heads * hd)
    assert out.dtype == torch.bfloat16 and rel_err(out, ref) < 2e-2


def tiny_swin(mask_padding=False, window=7, **kwargs):
    torch.manual_seed(0)
    model = SwinTransformer(embed_dims=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8),
                            window_size=window, mask_padding=mask_padding,
                            drop_path_rate=0.0, **kwargs)
    model.init_weights()
    with torch.no_grad():  # tables of trained size, so the bias matters in bf16 too
        for name, p in model.named_parameters():
            if 'relative_position_bias_table' in name:
                p.normal_(0, 1.0)
    return model


@pytest.mark.parametrize('backend', ['auto', 'generic'])
@pytest.mark.parametrize('mask_padding', [False, True], ids=['plain', 'mask_padding'])
@pytest.mark.parametrize('hw', THIN_AND_TINY + [(97, 131)])
def test_backbone_bf16_is_finite_and_close_to_float32(hw, mask_padding, backend):
    model = tiny_swin(mask_padding).eval()
    x = torch.randn(2, 3, *hw)
    with torch.no_grad():
        ref = model(x)
        with force_backend(backend), bf16():
            outs = model(x)
    for i, (out, r) in enumerate(zip(outs, ref)):
        assert torch.isfinite(out).all(), f'output {i} not finite'
        assert rel_err(out, r) < BF16_BACKBONE_REL_ERR, (i, rel_err(out, r))


@pytest.mark.parametrize('backend', ['auto', 'generic'])
def test_bf16_train_step_gradients_are_close_to_float32(backend):
    model = tiny_swin(window=(7, 5)).train()
    x = torch.randn(2, 3, 61, 93)
    # A loss with random weights: the mean square of normed outputs would be constant, its
    # gradients zero up to rounding noise.
    weights = [torch.randn(2, c, -(-61 // s), -(-93 // s))
               for c, s in zip(model.out_channels, model.out_strides)]
    grads = {}
    for dtype in ('fp32', 'bf16'):
        model.zero_grad()
        with force_backend(backend), torch.autocast('cpu', dtype=torch.bfloat16,
                                                    enabled=dtype == 'bf16'):
            outs = model(x)
        sum((o.float() * w).sum() for o, w in zip(outs, weights)).backward()
        grads[dtype] = {n: p.grad.clone() for n, p in model.named_parameters()}
    for name, g in grads['bf16'].items():
        assert g.dtype == torch.float32 and torch.isfinite(g).all(), name
        err = rel_err(g, grads['fp32'][name])
        assert err < BF16_GRAD_REL_ERR, (name, err)


def test_inference_reuses_bf16_weight_copies_until_the_weight_changes():
    """The copies serve the oneDNN path (CPUs with native bf16); the cache itself is tested on
    any CPU, and the product through ``linear`` (whichever library serves it) against F.linear."""
    from swin_rpe_plugin.ops.linear import _cast_parameter
    x, w = torch.randn(4, 8), torch.randn(6, 8)
    with torch.no_grad():
        copy = _cast_parameter(w, torch.bfloat16)
        assert copy.dtype == torch.bfloat16 and copy.equal(w.bfloat16())
        assert _cast_parameter(w, torch.bfloat16) is copy  # reused
        w.mul_(2)  # an optimizer step or load_state_dict changes the weight in place
        fresh = _cast_parameter(w, torch.bfloat16)
        assert fresh is not copy and fresh.equal(w.bfloat16())
        with bf16():
            second = linear(x, w)
    ref = F.linear(x.bfloat16().float(), w.bfloat16().float())
    assert torch.allclose(second.float(), ref, rtol=2**-8, atol=1e-3)
