"""Parity with the Swin that ships in mmdet 3.3 and mmseg 1.2: same weights, same outputs."""
import pytest
import torch

from swin_rpe_plugin import SwinTransformer

SWIN_T = dict(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), window_size=7,
              drop_path_rate=0.0)


def stock_swin(toolkit, **kwargs):
    if toolkit == 'mmdet':
        from mmdet.models.backbones import SwinTransformer as Stock
    else:
        from mmseg.models.backbones import SwinTransformer as Stock
    torch.manual_seed(1)
    model = Stock(**{**SWIN_T, **kwargs})
    model.init_weights()
    with torch.no_grad():  # stock init leaves the tables at zero: make the bias matter
        for name, p in model.named_parameters():
            if 'relative_position_bias_table' in name:
                p.normal_(0, 0.5)
            elif name.endswith('bias'):
                p.normal_(0, 0.02)
    return model


def ours_from(stock, **kwargs):
    ours = SwinTransformer(**{**SWIN_T, **kwargs})
    ours.load_state_dict(stock.state_dict(), strict=True)
    return ours


def run(model, x, train):
    model.train(train)
    x = x.clone().requires_grad_(train)
    outs = model(x)
    grads = None
    if train:
        sum(o.square().mean() for o in outs).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        grads['input'] = x.grad
    return outs, grads


def assert_same(stock, ours, hw, train, atol=1e-5):
    x = torch.randn(1, 3, *hw)
    ref_outs, ref_grads = run(stock, x, train)
    outs, grads = run(ours, x, train)
    assert len(outs) == len(ref_outs) == 4
    for a, b in zip(outs, ref_outs):
        assert a.shape == b.shape
        assert torch.allclose(a, b, atol=atol), (a - b).abs().max()
    if train:
        assert grads.keys() == ref_grads.keys()
        for name in grads:
            assert torch.allclose(grads[name], ref_grads[name], atol=atol, rtol=1e-4), name


@pytest.mark.parametrize('hw', [(224, 224), (97, 131), (383, 511)])
@pytest.mark.parametrize('train', [False, True], ids=['eval', 'train'])
def test_mmdet_parity(hw, train):
    stock = stock_swin('mmdet')
    assert_same(stock, ours_from(stock), hw, train)


@pytest.mark.parametrize('fused', [True, False], ids=['sdpa', 'explicit'])
def test_mmseg_parity_both_attention_paths(fused):
    stock = stock_swin('mmseg')
    ours = ours_from(stock, fused_attention=fused)
    assert_same(stock, ours, (97, 131), train=False)
    assert_same(stock, ours, (97, 131), train=True)


def test_parity_with_abs_pos_embed_and_patch_merging_odd_sizes():
    kwargs = dict(use_abs_pos_embed=True, pretrain_img_size=(100, 132))
    stock = stock_swin('mmdet', **kwargs)
    with torch.no_grad():
        stock.absolute_pos_embed.normal_()
    assert_same(stock, ours_from(stock, **kwargs), (97, 131), train=False)


def test_ours_shapes_are_ceil_divisions():
    model = SwinTransformer(**SWIN_T).eval()
    outs = model(torch.randn(2, 3, 97, 131))
    h, w = 97, 131
    h, w = -(-h // 4), -(-w // 4)
    for i, o in enumerate(outs):
        assert o.shape == (2, 96 * 2**i, h, w)
        h, w = -(-h // 2), -(-w // 2)
    assert model.out_channels == [96, 192, 384, 768] and model.out_strides == [4, 8, 16, 32]


@pytest.mark.parametrize('train', [False, True], ids=['eval', 'train'])
@pytest.mark.parametrize('hw', [(224, 224), (97, 131)])
def test_mmdet_parity_on_the_generic_path(hw, train):
    """The path CUDA and other devices take (F.linear, one SDPA call with bias + mask)."""
    from swin_rpe_plugin.ops.dispatch import force_backend
    stock = stock_swin('mmdet')
    ours = ours_from(stock)
    with force_backend('generic'):
        assert_same(stock, ours, hw, train)


def test_generic_and_cpu_paths_agree_with_padding_masks_and_valid_sizes():
    """No stock model masks padding: the two paths of ours check each other here."""
    from swin_rpe_plugin.ops.dispatch import force_backend
    ours = ours_from(stock_swin('mmdet'), mask_padding=True).train()
    x = torch.randn(2, 3, 97, 131)
    results = []
    for backend in ('auto', 'generic'):
        ours.zero_grad()
        with force_backend(backend):
            outs = ours(x, valid_sizes=[(97, 131), (61, 77)])
            sum(o.square().mean() for o in outs).backward()
        results.append((outs, {n: p.grad.clone() for n, p in ours.named_parameters()}))
    (outs_a, grads_a), (outs_b, grads_b) = results
    for a, b in zip(outs_a, outs_b):
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
    for name in grads_a:
        assert torch.allclose(grads_a[name], grads_b[name], atol=1e-5, rtol=1e-4), name


@pytest.mark.parametrize('train', [False, True], ids=['eval', 'train'])
@pytest.mark.parametrize('kernel', ['onednn', 'mkl'])
def test_mmdet_parity_with_each_linear_kernel(kernel, train):
    """Each library the per-shape measurement may choose, forced for every product."""
    from swin_rpe_plugin.ops.dispatch import force_kernel
    stock = stock_swin('mmdet')
    ours = ours_from(stock)
    with force_kernel('linear', kernel):
        assert_same(stock, ours, (97, 131), train)
