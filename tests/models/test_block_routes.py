"""Which definition a block runs, per combination: ``ops.block``'s two halves (the one
definition, with the CPU's or the generic kernels) or the modules' plain form (tracers, hooks,
SwinV2's post-norm, dropout that is active, the explicit attention, other activations).

A spy on the halves and on ``ShiftWindowMSA.forward`` counts each route's calls in one forward
of a two-stage backbone (four blocks)."""
import pytest
import torch

import swin_rpe_plugin.models.layers as layers
from swin_rpe_plugin import SwinTransformer, SwinTransformerV2
from swin_rpe_plugin.ops.dispatch import force_backend

SMALL = dict(embed_dims=16, depths=(2, 2), num_heads=(1, 2), strides=(4, 2), out_indices=(0, 1),
             window_size=4)


@pytest.fixture
def routes(monkeypatch):
    """{'block': halves run, 'modules': module-form attentions run}."""
    counts = {'block': 0, 'modules': 0}
    attention_half, module_forward = layers.attention_half, layers.ShiftWindowMSA.forward

    def spy_half(*args, **kwargs):
        counts['block'] += 1
        return attention_half(*args, **kwargs)

    def spy_module(self, *args, **kwargs):
        counts['modules'] += 1
        return module_forward(self, *args, **kwargs)

    monkeypatch.setattr(layers, 'attention_half', spy_half)
    monkeypatch.setattr(layers.ShiftWindowMSA, 'forward', spy_module)
    return counts


def run(model, train: bool, dtype=None):
    model.train(train)
    x = torch.randn(2, 3, 32, 40)
    with torch.set_grad_enabled(train), torch.autocast('cpu', torch.bfloat16,
                                                       enabled=dtype is not None):
        outs = model(x)
    if train:
        sum(o.float().sum() for o in outs).backward()


@pytest.mark.parametrize('backend', ['auto', 'generic'])
@pytest.mark.parametrize('train', [False, True])
@pytest.mark.parametrize('dtype', [None, torch.bfloat16])
@pytest.mark.parametrize('options', [{}, dict(drop_path_rate=0.3), dict(with_cp=True)],
                         ids=['plain', 'drop-path', 'with-cp'])
def test_v1_blocks_run_the_one_definition_on_both_paths(routes, backend, train, dtype, options):
    with force_backend(backend):
        run(SwinTransformer(**SMALL, **options), train, dtype)
    # with_cp: each half runs again in backward
    assert routes == {'block': 8 if train and options.get('with_cp') else 4, 'modules': 0}


@pytest.mark.parametrize('backend', ['auto', 'generic'])
@pytest.mark.parametrize('case, train, expected', [
    (dict(attn_drop_rate=0.1), True, 'modules'),  # dropout active: the module form
    (dict(drop_rate=0.1), True, 'modules'),
    (dict(attn_drop_rate=0.1, drop_rate=0.1), False, 'block'),  # inactive in eval mode
    (dict(act_cfg=dict(type='GELU', approximate='tanh')), False, 'modules'),
], ids=['attn-dropout', 'dropout', 'dropout-eval', 'tanh-gelu'])
def test_what_the_halves_do_not_compute_runs_the_module_form(routes, backend, case, train,
                                                              expected):
    with force_backend(backend):
        run(SwinTransformer(**SMALL, **case), train)
    assert routes == {'block': 4 * (expected == 'block'), 'modules': 4 * (expected == 'modules')}


def test_swin_v2_tracers_and_explicit_attention_run_the_module_form(routes):
    run(SwinTransformerV2(**SMALL), True)
    assert routes == {'block': 0, 'modules': 4}
    model = SwinTransformer(**SMALL).eval()
    torch.jit.trace(model, torch.randn(1, 3, 32, 32), check_trace=False)
    assert routes == {'block': 0, 'modules': 8}
    from swin_rpe_plugin.models.layers import WindowMSA
    for module in model.modules():
        if isinstance(module, WindowMSA):
            module.fused_attention = False
    run(model, False)
    assert routes == {'block': 0, 'modules': 12}
