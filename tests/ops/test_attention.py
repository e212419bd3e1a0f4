import torch

from swin_rpe_plugin.ops import shift_attention_mask, window_attention


def test_fused_and_explicit_agree_with_a_loop_reference():
    b, nw, heads, n, hd = 2, 4, 3, 49, 8
    q, k, v = (torch.randn(b * nw, heads, n, hd) for _ in range(3))
    bias = torch.randn(heads, n, n)
    mask = shift_attention_mask((14, 14), 7, 3)
    expected = torch.empty_like(q)
    for i in range(b * nw):  # one window at a time, plain formula
        logits = q[i] @ k[i].transpose(-1, -2) * hd ** -0.5 + bias + mask[i % nw]
        expected[i] = logits.softmax(-1) @ v[i]
    for fused in (True, False):
        out = window_attention(q, k, v, bias, mask, fused=fused)
        assert torch.allclose(out, expected, atol=1e-5)
    out = window_attention(q, k, v, bias, None, fused=True)
    ref = ((q @ k.transpose(-1, -2)) * hd ** -0.5 + bias).softmax(-1) @ v
    assert torch.allclose(out, ref, atol=1e-5)
