"""Continuous position bias and scaled cosine attention against brute-force formulas of the
SwinV2 paper (arXiv:2111.09883, eqs. 2-4), written per offset / per query-key pair."""
import math

import pytest
import torch
import torch.nn.functional as F

from swin_rpe_plugin.ops import (continuous_position_bias, log_spaced_relative_coords,
                                 relative_position_index, scaled_cosine_query_key,
                                 window_attention)


def brute_coords(window, pretrained):
    """Row (dy + Mh - 1) * (2Mw - 1) + (dx + Mw - 1): f(8 dy / (Ph - 1)), f(8 dx / (Pw - 1))."""
    (mh, mw), (ph, pw) = window, pretrained
    f = lambda d: math.copysign(math.log2(abs(d) + 1) / 3, d)  # log2(8) = 3
    rows = []
    for dy in range(-(mh - 1), mh):
        for dx in range(-(mw - 1), mw):
            rows.append((f(8 * dy / max((ph or mh) - 1, 1)), f(8 * dx / max((pw or mw) - 1, 1))))
    return torch.tensor(rows)


@pytest.mark.parametrize('window,pretrained', [((8, 8), (0, 0)), ((12, 12), (8, 8)),
                                               ((5, 7), (3, 4)), ((1, 6), (0, 0))])
def test_log_spaced_coords_match_the_formula(window, pretrained):
    coords = log_spaced_relative_coords(window, pretrained)
    assert coords.shape == ((2 * window[0] - 1) * (2 * window[1] - 1), 2)
    assert torch.allclose(coords, brute_coords(window, pretrained), atol=1e-6)


def test_pretrained_window_puts_seen_offsets_at_the_same_coordinates():
    # A window of 12 run with pretrained 8 sees offsets |d| <= 7 where the window-8 model did.
    small = log_spaced_relative_coords(8).view(15, 15, 2)
    large = log_spaced_relative_coords(12, 8).view(23, 23, 2)
    assert torch.equal(large[4:19, 4:19], small)
    assert large.abs().max() > small.abs().max()  # and extrapolates beyond them


def test_bad_pretrained_window_is_named():
    with pytest.raises(ValueError, match='pretrained_window_size'):
        log_spaced_relative_coords(8, -1)


def test_continuous_position_bias_is_the_mlp_of_each_pairs_offset():
    torch.manual_seed(0)
    window, heads = (3, 4), 2
    w1, b1, w2 = torch.randn(16, 2), torch.randn(16), torch.randn(heads, 16)
    bias = continuous_position_bias(log_spaced_relative_coords(window, (5, 5)),
                                    relative_position_index(window), w1, b1, w2)
    table = brute_coords(window, (5, 5)).view(5, 7, 2)
    tokens = [(y, x) for y in range(3) for x in range(4)]
    expected = torch.empty(heads, 12, 12)
    for i, (yi, xi) in enumerate(tokens):
        for j, (yj, xj) in enumerate(tokens):
            c = table[yi - yj + 2, xi - xj + 3]
            expected[:, i, j] = 16 * torch.sigmoid(w2 @ torch.relu(w1 @ c + b1))
    assert torch.allclose(bias, expected, atol=1e-5)


@pytest.mark.parametrize('fused', [True, False], ids=['sdpa', 'explicit'])
def test_window_attention_with_folded_scale_is_cosine_attention(fused):
    torch.manual_seed(0)
    q, k, v = (torch.randn(6, 3, 16, 8) for _ in range(3))
    bias = 16 * torch.rand(3, 16, 16)
    mask = torch.zeros(2, 16, 16)
    mask[1, :, :5] = -100.0  # the last window of each image masked (plan order)
    logit_scale = torch.tensor([math.log(10.0), 1.0, 6.0]).view(3, 1, 1)  # 6 > log(100)
    qs, ks = scaled_cosine_query_key(q, k, logit_scale)
    out = window_attention(qs, ks, v, bias, mask, 1.0, fused=fused, windows_per_image=3)
    scale = torch.tensor([10.0, math.e, 100.0]).view(3, 1, 1)  # clamped at 100
    cos = F.cosine_similarity(q.unsqueeze(3), k.unsqueeze(2), dim=-1)
    logits = (cos * scale + bias).view(2, 3, 3, 16, 16)
    logits[:, 2] += mask[1].unsqueeze(0)
    expected = (logits.view(6, 3, 16, 16).softmax(-1) @ v).transpose(1, 2).reshape(6, 16, 24)
    assert (out - expected).abs().max() < 1e-4  # logits up to ~116: float32 rounding
