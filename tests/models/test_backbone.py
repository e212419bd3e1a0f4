"""Backbone behaviour around the numerics: checkpointing, freezing, modes, errors, masks."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from swin_rpe_plugin import SwinTransformer
from swin_rpe_plugin.ops.dispatch import force_backend

SMALL = dict(embed_dims=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8), window_size=7,
             drop_path_rate=0.0)


def grads_of(model, x):
    model.train()
    sum(o.sum() for o in model(x)).backward()
    return {n: p.grad for n, p in model.named_parameters()}


class _LayerNormCalls(TorchDispatchMode):
    """Counts ``native_layer_norm`` forwards: a checkpointed half recomputes its norm once."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func is torch.ops.aten.native_layer_norm.default
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize('backend', ['auto', 'generic'])
@pytest.mark.parametrize('dtype', [None, torch.bfloat16])
@pytest.mark.parametrize('frozen', [-1, 0])
def test_with_cp_gives_the_same_gradients(backend, dtype, frozen, monkeypatch):
    """with_cp checkpoints each half of every block (attention, FFN) on the CPU path and on
    the generic path, with drop path drawing the same images in the recomputation, also where
    the blocks' input takes no gradient (frozen_stages=0: mmdet then skips checkpointing);
    gradients equal the unchecked model's with the same weights, and every half runs its
    forward once more (one more LayerNorm each)."""
    import torch.utils.checkpoint as checkpoint
    regions = []

    def counted(*args, **kwargs):
        regions.append(1)
        return run_checkpoint(*args, **kwargs)

    run_checkpoint = checkpoint.checkpoint
    monkeypatch.setattr(checkpoint, 'checkpoint', counted)
    kwargs = dict(SMALL, drop_path_rate=0.3, frozen_stages=frozen)
    torch.manual_seed(0)
    plain = SwinTransformer(**kwargs)
    plain.init_weights()
    cp = SwinTransformer(**kwargs, with_cp=True)
    cp.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 75, 90)
    grads, calls = [], []
    for model in (plain, cp):
        torch.manual_seed(1)
        counter = _LayerNormCalls()
        with force_backend(backend), counter, torch.autocast('cpu', torch.bfloat16,
                                                             enabled=dtype is not None):
            grads.append(grads_of(model, x))
        calls.append(counter.calls)
    for name, ref in grads[0].items():
        if ref is None:
            assert grads[1][name] is None, name
        else:
            assert torch.allclose(ref, grads[1][name], atol=1e-6, rtol=1e-5), name
    assert len(regions) == calls[1] - calls[0] == 2 * sum(SMALL['depths'])


@pytest.mark.parametrize('frozen', [-1, 0, 1, 2, 4])
@pytest.mark.parametrize('out_indices', [(0, 1, 2, 3), (1, 3)])
def test_frozen_stages_freeze_exactly_what_mmdet_freezes(frozen, out_indices):
    from mmdet.models.backbones import SwinTransformer as Stock
    kwargs = dict(**SMALL, frozen_stages=frozen, out_indices=out_indices,
                  use_abs_pos_embed=True)
    stock, ours = Stock(**kwargs), SwinTransformer(**kwargs)
    stock.train()
    assert ours.train() is ours  # mmdet's train() returns None

    def state(model):
        frozen_params = {n for n, p in model.named_parameters() if not p.requires_grad}
        eval_modules = {n for n, m in model.named_modules() if not m.training}
        return frozen_params, eval_modules

    s_params, s_eval = state(stock)
    o_params, o_eval = state(ours)
    assert o_params == s_params
    # Compare modules that exist in both (stock has extra wrapper modules such as adap_padding).
    ours_names = {n for n, _ in ours.named_modules()}
    assert o_eval == {n for n in s_eval if n in ours_names}
    assert ours.eval() is ours and not ours.training


def test_init_weights_initialises_bias_tables_and_honours_pretrained(tmp_path):
    model = SwinTransformer(**SMALL)
    model.init_weights()
    table = model.stages[0].blocks[0].attn.w_msa.relative_position_bias_table
    assert 0.005 < table.std().item() < 0.05  # trunc_normal(std=.02), not left at zero
    path = tmp_path / 'backbone.pth'
    torch.save({'state_dict': {'backbone.' + k: v for k, v in model.state_dict().items()}}, path)
    with pytest.warns(DeprecationWarning):
        loaded = SwinTransformer(**SMALL, pretrained=str(path))
    assert loaded.init_cfg == dict(type='Pretrained', checkpoint=str(path))
    loaded.init_weights()
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_state_dict_has_no_derived_buffers():
    keys = SwinTransformer(**SMALL).state_dict().keys()
    assert not [k for k in keys if 'relative_position_index' in k or 'mask' in k]


def test_rectangular_window_runs_and_masks_are_cached():
    model = SwinTransformer(**{**SMALL, 'window_size': (7, 12)}).eval()
    attn = model.stages[0].blocks[1].attn
    assert attn.shift_size == (3, 6)
    assert attn.w_msa.relative_position_bias_table.shape == (13 * 23, 1)
    from swin_rpe_plugin.ops import cached_window_plan
    cached_window_plan.cache_clear()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 97, 131))
        model(torch.randn(1, 3, 97, 131))
    assert [o.shape[-2:] for o in outs] == [(25, 33), (13, 17), (7, 9), (4, 5)]
    info = cached_window_plan.cache_info()
    # 4 stage sizes x 2 shifts built once in the first forward; the second forward only hits.
    assert info.misses == 8 and info.hits == 8


@pytest.mark.parametrize('shift', [False, True])
def test_padding_mask_makes_a_block_blind_to_padding_content(shift):
    # The same 10x11 tokens, once padded with zeros inside the block and once embedded in a
    # 14x14 map of garbage: with the padding key mask, the valid outputs must be equal.
    from swin_rpe_plugin.models.layers import SwinBlock
    from swin_rpe_plugin.ops import window_plan
    torch.manual_seed(0)
    block = SwinBlock(32, 2, 128, window_size=7, shift=shift).eval()
    with torch.no_grad():
        block.attn.w_msa.relative_position_bias_table.normal_()
    x = torch.randn(1, 10, 11, 32)
    garbage = torch.randn(1, 14, 14, 32) * 5
    garbage[:, :10, :11] = x
    shift = block.shift_size
    with torch.no_grad():
        inside = block(x.reshape(1, 110, 32), (10, 11),
                       window_plan((10, 11), 7, shift, valid_hw=(10, 11)))
        embedded = block(garbage.reshape(1, 196, 32), (14, 14),
                         window_plan((14, 14), 7, shift, valid_hw=(10, 11)))
        unmasked = block(garbage.reshape(1, 196, 32), (14, 14), window_plan((14, 14), 7, shift))
    inside, embedded = inside.reshape(1, 10, 11, 32), embedded.reshape(1, 14, 14, 32)
    assert torch.allclose(inside, embedded[:, :10, :11], atol=1e-5)
    assert not torch.allclose(inside, unmasked.reshape(1, 14, 14, 32)[:, :10, :11], atol=1e-3)


def test_mask_padding_changes_only_padded_feature_maps():
    torch.manual_seed(0)
    plain = SwinTransformer(**SMALL).eval()
    plain.init_weights()
    masked = SwinTransformer(**SMALL, mask_padding=True).eval()
    masked.load_state_dict(plain.state_dict())
    with torch.no_grad():
        x = torch.randn(1, 3, 200, 180)
        differs = [not torch.allclose(a, b, atol=1e-4) for a, b in zip(plain(x), masked(x))]
    x = torch.randn(1, 3, 224, 224)  # 56, 28, 14, 7 tokens: no window padding anywhere
    with torch.no_grad():
        for a, b in zip(plain(x), masked(x)):
            assert torch.equal(a, b)
    assert differs[0]  # 50x45 tokens are padded in stage 0: masking changes the features


@pytest.mark.parametrize('kwargs,match', [
    (dict(window_size=0), 'window_size'),
    (dict(window_size=(7, -1)), 'window_size'),
    (dict(embed_dims=30, num_heads=(4, 8, 16, 32)), 'divisible by num_heads'),
    (dict(depths=(2, 2, 2), num_heads=(1, 2, 4, 8)), 'depths'),
    (dict(out_indices=(0, 4)), 'out_indices'),
    (dict(patch_size=4, strides=(2, 2, 2, 2)), 'patch_size'),
    (dict(frozen_stages=7), 'frozen_stages'),
    (dict(pretrained=3), 'pretrained'),
    (dict(pretrained='a.pth', init_cfg=dict(type='Pretrained', checkpoint='b.pth')),
     'init_cfg'),
])
def test_bad_arguments_are_refused_with_their_name(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        SwinTransformer(**{**SMALL, **kwargs})


@pytest.mark.parametrize('x,match', [
    (torch.zeros(3, 32, 32), '4-D'),
    (torch.zeros(1, 1, 32, 32), 'in_channels=3'),
])
def test_bad_input_is_refused_with_its_shape(x, match):
    with pytest.raises(ValueError, match=match):
        SwinTransformer(**SMALL)(x)


@pytest.mark.parametrize('hw', [(16, 24), (17, 22)])
def test_patch_embed_matches_mmdets_and_keeps_only_the_image(hw):
    """Outputs and gradients of mmdet's own PatchEmbed (conv, corner padding, norm; same
    weights), with backward's projection keeping the caller's image, not its rows of patches
    (recomputed in backward): besides the image only the norm keeps a tensor, its input."""
    from mmdet.models.layers import PatchEmbed as StockEmbed

    from swin_rpe_plugin.models.layers import PatchEmbed
    torch.manual_seed(0)
    stock = StockEmbed(in_channels=3, embed_dims=8, kernel_size=4, stride=4,
                       norm_cfg=dict(type='LN'))
    with torch.no_grad():
        stock.norm.weight.normal_(), stock.norm.bias.normal_()
    ours = PatchEmbed(3, 8, (4, 4), dict(type='LN'))
    ours.load_state_dict(stock.state_dict(), strict=True)
    image = torch.randn(2, 3, *hw)
    params = {p.untyped_storage().data_ptr() for p in ours.parameters()}
    kept = []

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            kept.append(t)
        return t

    out_ref, grid_ref = stock(image)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out, grid = ours(image)
    assert tuple(grid) == tuple(grid_ref) and torch.allclose(out, out_ref, atol=1e-5)
    # The image, the norm's input, and the norm's per-token statistics (mean, 1/std).
    shapes = sorted(tuple(t.shape) for t in kept)
    assert shapes == sorted([tuple(image.shape), tuple(out.shape), (*out.shape[:2], 1),
                             (*out.shape[:2], 1)]), shapes
    assert any(t.untyped_storage().data_ptr() == image.untyped_storage().data_ptr()
               for t in kept)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, list(ours.parameters()), g)
    expected = torch.autograd.grad(out_ref, list(stock.parameters()), g)
    for a, b in zip(got, expected):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize('hw', [(6, 8), (5, 7)], ids=['even', 'odd'])
def test_patch_merging_matches_mmdets_and_keeps_only_its_input(hw):
    """Outputs and gradients of mmdet's own PatchMerging (same weights), with backward keeping
    x alone: the 2x2 neighbourhoods and their norm are recomputed from it, not kept."""
    from mmdet.models.layers import PatchMerging as StockMerging

    from swin_rpe_plugin.models.layers import PatchMerging
    torch.manual_seed(0)
    stock = StockMerging(8, 16)
    with torch.no_grad():
        stock.norm.weight.normal_(), stock.norm.bias.normal_()
    ours = PatchMerging(8, 16)
    ours.load_state_dict(stock.state_dict(), strict=True)
    x = torch.randn(2, hw[0] * hw[1], 8)
    params = {p.untyped_storage().data_ptr() for p in ours.parameters()}
    kept = set()

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            kept.add(t.untyped_storage().data_ptr())
        return t

    results = []
    for model, keep in ((stock, False), (ours, True)):
        xi = x.clone().requires_grad_()
        with torch.autograd.graph.saved_tensors_hooks(pack if keep else (lambda t: t),
                                                      lambda t: t):
            out, out_hw = model(xi, hw)
        grads = torch.autograd.grad(out.square().sum(), [xi, *model.parameters()])
        results.append((out, out_hw, grads))
        if keep:
            assert kept == {xi.untyped_storage().data_ptr()}
    (ref, ref_hw, ref_grads), (out, out_hw, grads) = results
    assert tuple(out_hw) == tuple(ref_hw) and torch.allclose(out, ref, atol=1e-5)
    for got, expected in zip(grads, ref_grads):
        assert torch.allclose(got, expected, atol=1e-5, rtol=1e-4)
