"""Which definition a block runs, per combination: ``ops.block``'s two halves (the one
definition, with the CPU's or the generic kernels; V1 and SwinV2, dropout, drop path,
with_cp) or the modules' plain form (tracers, hooks, the explicit attention, other
activations).

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


ARCHS = {'v1': SwinTransformer, 'v2': SwinTransformerV2}
DROPOUT = dict(drop_rate=0.2, attn_drop_rate=0.2)


@pytest.mark.parametrize('backend', ['auto', 'generic'])
@pytest.mark.parametrize('train', [False, True])
@pytest.mark.parametrize('dtype', [None, torch.bfloat16])
@pytest.mark.parametrize('options', [{}, dict(drop_path_rate=0.3), dict(with_cp=True), DROPOUT],
                         ids=['plain', 'drop-path', 'with-cp', 'dropout'])
@pytest.mark.parametrize('arch', ['v1', 'v2'])
def test_blocks_run_the_one_definition_on_both_paths(routes, backend, train, dtype, options,
                                                     arch):
    with force_backend(backend):
        run(ARCHS[arch](**SMALL, **options), train, dtype)
    # with_cp: each half runs again in backward
    assert routes == {'block': 8 if train and options.get('with_cp') else 4, 'modules': 0}


@pytest.mark.parametrize('backend', ['auto', 'generic'])
@pytest.mark.parametrize('arch', ['v1', 'v2'])
@pytest.mark.parametrize('options', [dict(drop_path_rate=0.3), dict(DROPOUT, with_cp=True),
                                     dict(DROPOUT, drop_path_rate=0.3)],
                         ids=['drop-path', 'dropout-with-cp', 'dropout-drop-path'])
def test_the_halves_equal_the_module_form(backend, arch, options):
    """Outputs and gradients of the halves against the module form (mmdet's module order,
    which tests/models/test_parity.py and test_swin_v2.py hold against mmdet and transformers)
    with the same weights and seed: the dropouts and drop path draw the same numbers in the
    same order. A forward hook sends a block through the module form."""
    torch.manual_seed(0)
    model = ARCHS[arch](**SMALL, **options).train()
    with torch.no_grad():  # non-zero norms and biases (SwinV2 starts its post-norms at 0)
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.normal_(0.5 if name.endswith('weight') else 0., 0.2)
    x = torch.randn(2, 3, 32, 40)
    results = []
    for hooked in (False, True):
        handles = [block.attn.register_forward_hook(lambda *args: None)
                   for stage in model.stages for block in stage.blocks] if hooked else []
        model.zero_grad()
        torch.manual_seed(1)
        with force_backend(backend):
            outs = model(x)
            sum(o.square().mean() for o in outs).backward()
        results.append(([o.detach() for o in outs],
                        {n: p.grad.clone() for n, p in model.named_parameters()}))
        for handle in handles:
            handle.remove()
    (outs, grads), (ref_outs, ref_grads) = results
    for a, b in zip(outs, ref_outs):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    for name, ref in ref_grads.items():
        assert torch.allclose(grads[name], ref, atol=1e-5, rtol=1e-4), name
    assert not all(torch.equal(a, b) for a, b in zip(outs, run_without_dropout(model, x)))


def run_without_dropout(model, x):
    """The same model's outputs in eval mode (no dropout, no drop path)."""
    with torch.no_grad():
        return model.eval()(x)


@pytest.mark.parametrize('backend', ['auto', 'generic'])
@pytest.mark.parametrize('case, train, expected', [
    (dict(act_cfg=dict(type='GELU', approximate='tanh')), False, 'modules'),
    (dict(act_cfg=dict(type='GELU', approximate='tanh')), True, 'modules'),
], ids=['tanh-gelu-eval', 'tanh-gelu-train'])
def test_what_the_halves_do_not_compute_runs_the_module_form(routes, backend, case, train,
                                                              expected):
    with force_backend(backend):
        run(SwinTransformer(**SMALL, **case), train)
    assert routes == {'block': 4 * (expected == 'block'), 'modules': 4 * (expected == 'modules')}


@pytest.mark.parametrize('arch', ['v1', 'v2'])
def test_tracers_and_explicit_attention_run_the_module_form(routes, arch):
    model = ARCHS[arch](**SMALL).eval()
    torch.jit.trace(model, torch.randn(1, 3, 32, 32), check_trace=False)
    assert routes == {'block': 0, 'modules': 4}
    from swin_rpe_plugin.models.layers import WindowMSA
    for module in model.modules():
        if isinstance(module, WindowMSA):
            module.fused_attention = False
    run(model, False)
    assert routes == {'block': 0, 'modules': 8}
