"""Padding-aware backbone: an image's features do not depend on how its batch was padded."""
import pytest
import torch

from swin_rpe_plugin import SwinTransformer

SMALL = dict(embed_dims=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8), drop_path_rate=0.0)


def model(window, **kwargs):
    torch.manual_seed(0)
    m = SwinTransformer(**SMALL, window_size=window, **kwargs).eval()
    m.init_weights()
    with torch.no_grad():  # make the position bias matter
        for name, p in m.named_parameters():
            if name.endswith('relative_position_bias_table'):
                p.normal_()
    return m


def crop(feats, index, hw):
    """Each feature map of image `index` cut to the map of an image of hw pixels alone."""
    out, (h, w) = [], (-(-hw[0] // 4), -(-hw[1] // 4))
    for f in feats:
        out.append(f[index:index + 1, :, :h, :w])
        h, w = -(-h // 2), -(-w // 2)
    return out


@pytest.mark.parametrize('window', [7, (7, 12)])
def test_image_alone_equals_image_on_a_zero_canvas(window):
    m = model(window, mask_padding=True)
    x = torch.randn(1, 3, 97, 131)
    canvas = torch.zeros(1, 3, 224, 224)
    canvas[..., :97, :131] = x
    with torch.no_grad():
        alone = m(x)
        placed = m(canvas, valid_sizes=[(97, 131)])
        unaware = m(canvas)
    for a, p, u in zip(alone, crop(placed, 0, (97, 131)), crop(unaware, 0, (97, 131))):
        assert a.shape == p.shape
        torch.testing.assert_close(p, a, atol=1e-4, rtol=0)
    assert not torch.allclose(crop(unaware, 0, (97, 131))[1], alone[1], atol=1e-2)
    # Outside the valid region the returned maps are zero.
    for f, a in zip(placed, alone):
        inside = torch.zeros_like(f, dtype=torch.bool)
        inside[..., :a.shape[2], :a.shape[3]] = True
        assert f[~inside].abs().max() == 0


@pytest.mark.parametrize('window', [7, (7, 12)])
def test_batched_images_equal_each_image_alone(window):
    m = model(window, mask_padding=True)
    sizes = [(97, 131), (150, 90)]
    images = [torch.randn(1, 3, *s) for s in sizes]
    batch = torch.full((2, 3, 160, 160), 3.0)  # a non-zero pad value must not matter either
    for i, (img, (h, w)) in enumerate(zip(images, sizes)):
        batch[i, :, :h, :w] = img[0]
    with torch.no_grad():
        batched = m(batch, valid_sizes=torch.tensor(sizes))
        for i, (img, size) in enumerate(zip(images, sizes)):
            for a, b in zip(m(img), crop(batched, i, size)):
                torch.testing.assert_close(b, a, atol=1e-4, rtol=0)


def test_without_padding_valid_sizes_change_nothing():
    plain, aware = model(7), model(7, mask_padding=True)
    x = torch.randn(2, 3, 224, 224)  # 56, 28, 14, 7 tokens: multiples of the window
    with torch.no_grad():
        for a, b in zip(plain(x), aware(x, valid_sizes=[(224, 224)] * 2)):
            assert torch.equal(a, b)


def test_gradients_stay_inside_the_valid_region():
    m = model(7, mask_padding=True).train()
    x = torch.randn(1, 3, 64, 96, requires_grad=True)
    outs = m(x, valid_sizes=[(40, 50)])
    sum(o.sum() for o in outs).backward()
    assert x.grad[..., 40:, :].abs().max() == 0 and x.grad[..., :, 50:].abs().max() == 0
    assert x.grad[..., :40, :50].abs().max() > 0


@pytest.mark.parametrize('valid_sizes,exc,match', [
    ([(10, 10)], ValueError, 'valid_sizes has 1 entries but the batch has 2'),
    ([(10, 10), (65, 10)], ValueError, r'valid_sizes\[1\]=\(65, 10\)'),
    ([(10, 10), (0, 10)], ValueError, r'valid_sizes\[1\]=\(0, 10\)'),
    (torch.ones(2, 2), ValueError, 'integer tensor'),
    ([10, 10], TypeError, 'pairs'),
])
def test_bad_valid_sizes_are_refused_with_their_name(valid_sizes, exc, match):
    with pytest.raises(exc, match=match):
        model(7)(torch.zeros(2, 3, 64, 64), valid_sizes=valid_sizes)
