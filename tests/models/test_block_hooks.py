"""Forward hooks on a block's parts (norm1, attn, norm2, ffn) fire on every path, once per call,
and see what the same hooks see on mmdet 3.3's Swin with the same weights: a hooked block runs
in mmdet's module order (docs/backbone.md). Without hooks the generic path runs
``ops.block``'s two halves, which call no submodule."""
import pytest
import torch

from swin_rpe_plugin import SwinTransformer
from swin_rpe_plugin.ops.dispatch import force_backend

SMALL = dict(embed_dims=32, depths=(2, 2), num_heads=(2, 4), strides=(4, 2),
             out_indices=(0, 1), window_size=4, drop_path_rate=0.0)
PARTS = ('norm1', 'attn', 'norm2', 'ffn')


def stock_and_ours():
    from mmdet.models.backbones import SwinTransformer as Stock
    torch.manual_seed(0)
    stock = Stock(**SMALL)
    stock.init_weights()
    with torch.no_grad():
        for name, p in stock.named_parameters():
            if 'relative_position_bias_table' in name or name.endswith('bias'):
                p.normal_(0, 0.2)
    ours = SwinTransformer(**SMALL)
    ours.load_state_dict(stock.state_dict())
    return stock, ours


def record_hooks(model, pre: bool = False):
    """{(block name, part): [output of each call]} filled by hooks on every block's parts."""
    seen = {}
    for stage_index, stage in enumerate(model.stages):
        for block_index, block in enumerate(stage.blocks):
            for part in PARTS:
                calls = seen.setdefault((stage_index, block_index, part), [])
                module = getattr(block, part)
                if pre:
                    module.register_forward_pre_hook(
                        lambda m, args, calls=calls: calls.append(args[0].detach().clone()))
                else:
                    module.register_forward_hook(
                        lambda m, args, out, calls=calls: calls.append(out.detach().clone()))
    return seen


@pytest.mark.parametrize('backend', ['auto', 'generic'])
@pytest.mark.parametrize('train', [False, True])
@pytest.mark.parametrize('pre', [False, True])
def test_hooks_fire_once_and_see_what_mmdets_see(backend, train, pre):
    stock, ours = stock_and_ours()
    stock.train(train)
    ours.train(train)
    x = torch.randn(2, 3, 44, 60)
    unhooked = ours(x)
    expected, got = record_hooks(stock, pre), record_hooks(ours, pre)
    with force_backend(backend), torch.set_grad_enabled(train):
        ref = stock(x)
        outs = ours(x)
        if train:
            sum(o.square().mean() for o in outs).backward()  # no hook fires again in backward
    assert got.keys() == expected.keys()
    for key in expected:
        assert len(got[key]) == len(expected[key]) == 1, key
        assert torch.allclose(got[key][0], expected[key][0], atol=1e-5), key
    for a, b, c in zip(outs, ref, unhooked):
        assert torch.allclose(a, b, atol=1e-5) and torch.allclose(a, c, atol=1e-5)


@pytest.mark.parametrize('backend', ['auto', 'generic'])
def test_only_hooked_blocks_leave_the_one_block(monkeypatch, backend):
    """The reverse: an unhooked block on the CPU path and on the generic path runs
    ``ops.block``'s attention half, which calls no submodule, and a hook on one block's part
    sends that block alone through the module form."""
    import swin_rpe_plugin.models.layers as layers
    _, ours = stock_and_ours()
    ran = []

    def spy(*args, **kwargs):
        ran.append(1)
        return attention_half(*args, **kwargs)

    attention_half = layers.attention_half
    monkeypatch.setattr(layers, 'attention_half', spy)
    x = torch.randn(1, 3, 32, 32)
    with force_backend(backend):
        ours(x)
        assert len(ran) == 4
        ours.stages[1].blocks[0].ffn.register_forward_hook(lambda m, args, out: None)
        ours(x)
        assert len(ran) == 4 + 3
