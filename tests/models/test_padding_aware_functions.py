"""The tensor functions behind padding-aware necks and heads, against plain references."""
import pytest
import torch
import torch.nn.functional as F

from swin_rpe_plugin.models.padding import (PaddingState, PerImageConv2d, feature_stride,
                                            mask_conv_inputs, region_mask, replicate_edges,
                                            resize_regions, run_convs_per_image, valid_sizes_at,
                                            zero_beyond_)


def test_feature_stride_and_valid_sizes_follow_nested_ceilings():
    # The backbone and FPN halve with ceilings; an image's region shrinks the same way.
    for hp, wp in [(128, 160), (100, 75), (511, 511), (112, 137)]:
        hf, wf, vh, vw = hp, wp, hp - 3, wp - 5
        for k in range(6):
            if hf > 1 or wf > 1:  # a 1x1 map is every stride at once
                assert feature_stride((hf, wf), (hp, wp)) == 2**k
            assert valid_sizes_at([(hp - 3, wp - 5)], (hf, wf), (hp, wp)) == ((vh, vw),)
            hf, wf, vh, vw = -(-hf // 2), -(-wf // 2), -(-vh // 2), -(-vw // 2)
    assert valid_sizes_at([(97, 131), (150, 90)], (40, 40), (160, 160)) == ((25, 33), (38, 23))


def test_feature_stride_refuses_maps_that_are_not_strided_views():
    with pytest.raises(ValueError, match='power-of-two stride'):
        feature_stride((14, 14), (128, 160))


def test_region_mask():
    m = region_mask([(2, 3), (4, 1)], (4, 5), torch.zeros(1, dtype=torch.float64))
    assert m.shape == (2, 1, 4, 5) and m.dtype == torch.float64
    assert m[0, 0].sum() == 6 and m[0, 0, :2, :3].all() and m[1, 0, :, 0].all()
    assert m[1, 0].sum() == 4


@pytest.mark.parametrize('mode,align', [('bilinear', False), ('bilinear', True),
                                        ('nearest', None)])
def test_resize_regions_is_each_region_resized_alone(mode, align):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 11)
    valid, out_valid, out_hw = [(5, 7), (9, 4)], [(10, 13), (17, 8)], (18, 22)
    out = resize_regions(x, valid, out_valid, out_hw, mode, align)
    assert out.shape == (2, 3, 18, 22)
    for b, ((h, w), (oh, ow)) in enumerate(zip(valid, out_valid)):
        kwargs = {} if mode == 'nearest' else {'align_corners': align}
        ref = F.interpolate(x[b:b + 1, :, :h, :w].clone(), size=(oh, ow), mode=mode, **kwargs)
        assert torch.equal(out[b:b + 1, :, :oh, :ow], ref)
        assert out[b, :, oh:].abs().sum() == 0 and out[b, :, :, ow:].abs().sum() == 0
    # what lies beyond a region never reaches the output
    y = x.clone()
    y[0, :, 5:] = 1e6
    y[1, :, :, 4:] = -1e6
    assert torch.equal(resize_regions(y, valid, out_valid, out_hw, mode, align), out)


def test_replicate_edges_copies_the_last_row_and_column_outwards():
    x = torch.arange(2 * 1 * 4 * 5, dtype=torch.float32).view(2, 1, 4, 5)
    before = x.clone()
    y = replicate_edges(x, [(2, 3), (4, 5)])
    assert torch.equal(x, before)  # the input is not changed
    assert torch.equal(y[1], x[1])  # a full region: nothing to copy
    assert torch.equal(y[0, 0, 2, :3], x[0, 0, 1, :3])
    assert torch.equal(y[0, 0, :2, 3], x[0, 0, :2, 2])
    assert y[0, 0, 2, 3] == x[0, 0, 1, 2]
    assert torch.equal(y[0, 0, 3], x[0, 0, 3]) and torch.equal(y[0, 0, :, 4], x[0, 0, :, 4])
    assert replicate_edges(x, [(4, 5), (4, 5)]) is x
    z = replicate_edges(x, [(2, 3), (4, 5)], in_place=True)  # without autograd: no copy
    assert z is x and torch.equal(x, y)


def test_zero_beyond_writes_zeros_beyond_each_region_only():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, 7)
    valid = [(4, 5), (6, 7)]
    ref = x * region_mask(valid, (6, 7), x)
    y = x.clone()
    assert zero_beyond_(y, valid) is y
    assert torch.equal(y, ref)
    assert torch.equal(y[1], x[1])  # a full region is left as it is


def _state(sizes, input_hw):
    state = PaddingState()
    state.sizes, state.input_hw = list(sizes), input_hw
    return state


def test_masked_map_is_changed_in_place_only_without_autograd():
    torch.manual_seed(0)
    state = _state([(13, 21), (32, 17)], (32, 32))  # stride 4 on an 8x8 map
    x = torch.randn(2, 5, 8, 8)
    ref = x * region_mask([(4, 6), (8, 5)], (8, 8), x)
    # inference: the map itself, zeroed beyond the images; then known to be clean
    y = x.clone()
    with torch.no_grad():
        out = state.masked(y)
    assert out is y and torch.equal(y, ref) and state.is_clean(y)
    # autograd on: a copy, the input untouched, the gradient masked
    w = x.clone().requires_grad_()
    out = state.masked(w)
    assert out is not w and torch.equal(out, ref) and torch.equal(w.detach(), x)
    out.sum().backward()
    assert torch.equal(w.grad, region_mask([(4, 6), (8, 5)], (8, 8), x).expand_as(x))
    # a map no image is padded on is not touched
    full = _state([(32, 32), (32, 32)], (32, 32))
    z = torch.randn(2, 5, 8, 8)
    with torch.no_grad():
        assert full.masked(z) is z


def test_conv_input_hook_zeroes_the_padding_as_a_masked_copy_would():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(4, 6, 3, padding=1)
    state = _state([(20, 28), (31, 9)], (32, 32))
    mask_conv_inputs(conv, state)
    x = torch.randn(2, 4, 8, 8)
    ref = F.conv2d(x * region_mask([(5, 7), (8, 3)], (8, 8), x), conv.weight, conv.bias,
                   padding=1)
    with torch.no_grad():
        assert torch.equal(conv(x.clone()), ref)
    w = x.clone().requires_grad_()
    out = conv(w)
    assert torch.equal(out, ref) and torch.equal(w.detach(), x)
    out.sum().backward()
    assert torch.equal(w.grad[1, :, :, 3:], torch.zeros(4, 8, 5))


@pytest.mark.parametrize('kernel,stride,padding', [(1, 1, 0), (3, 1, 1), (3, 2, 1)])
def test_per_image_conv_gives_each_image_its_conv_alone(kernel, stride, padding):
    """Without autograd each image's output is, bit for bit, the conv of that image alone at
    its own size (zeros beyond it); with autograd the stock conv runs."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(4, 6, kernel, stride, padding)
    regions = [(5, 7), (8, 3)]
    state = _state([(20, 28), (31, 9)], (32, 32))  # stride 4 on an 8x8 map
    assert run_convs_per_image(conv, state) == 1 and isinstance(conv, PerImageConv2d)
    x = torch.randn(2, 4, 8, 8) * region_mask(regions, (8, 8), torch.zeros(1))
    with torch.no_grad():
        out = conv(x)
    assert out.shape == F.conv2d(x, conv.weight, conv.bias, stride, padding).shape
    for b, (h, w) in enumerate(regions):
        alone = F.conv2d(x[b:b + 1, :, :h, :w].contiguous(), conv.weight, conv.bias, stride,
                         padding)
        oh, ow = alone.shape[-2:]
        assert torch.equal(out[b:b + 1, :, :oh, :ow], alone)
        assert not out[b, :, oh:].any() and not out[b, :, :, ow:].any()
    assert torch.equal(conv(x), F.conv2d(x, conv.weight, conv.bias, stride, padding))
