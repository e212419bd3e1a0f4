"""torch.compile on a tiny backbone gives the eager outputs (and gradients)."""
import pytest
import torch

from swin_rpe_plugin import SwinTransformer

# heavy: minutes, scheduled first (tests/conftest.py); dynamo runs on some Pythons only per torch
pytestmark = [pytest.mark.heavy, pytest.mark.needs('HAS_COMPILE')]

TINY = dict(embed_dims=16, depths=(2, 2), num_heads=(1, 2), strides=(4, 2), out_indices=(0, 1),
            window_size=(7, 5), drop_path_rate=0.0)
ONE_STAGE = dict(TINY, depths=(2,), num_heads=(1,), strides=(4,), out_indices=(0,))


def test_compiled_equals_eager_in_eval_and_train():
    """Eval: the two-stage backbone where the torch traces the window plan (2.5+), one stage
    below. Train: one stage (shifted and unshifted blocks, padding masked). Torch 2.1's inductor
    spends minutes in its C++ code generator on the two-stage graphs (eval: 851 s of the compat
    suite on an Intel Xeon 6/207, against 88 s on torch 2.13); its patch merging (the 2x2
    neighbourhoods, a LayerNorm and a linear) is compiled by inductor in SwinV2's test below
    and trains compiled with 'aot_eager' in tests/ops/test_compiled_fast_paths.py."""
    from swin_rpe_plugin.compat import _COMPILE_TRACES_WINDOW_PLAN
    torch.manual_seed(0)
    x = torch.randn(2, 3, 97, 131)
    eval_config = TINY if _COMPILE_TRACES_WINDOW_PLAN else ONE_STAGE
    for config, train in ((eval_config, False), (ONE_STAGE, True)):
        model = SwinTransformer(**config, mask_padding=True)
        model.init_weights()
        compiled = torch.compile(model)
        model.train(train)
        if not train:
            with torch.no_grad():
                for a, b in zip(model(x), compiled(x)):
                    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
            continue
        grads = []
        for m in (model, compiled):
            model.zero_grad()
            sum(o.square().mean() for o in m(x)).backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        for name in grads[0]:
            torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-5, rtol=1e-4)


def test_compiled_swinv2_equals_eager():
    """Both stages with shifted and unshifted blocks where the torch traces the window plan
    (2.5+); below, the second stage's shifted block is left out: with it torch 2.1's inductor
    took 206 s (sympy in its C++ code generator), without it 59 s (Intel Xeon 6/207), and the
    parts compiled are the same: blocks of both kinds, patch merging, a block after it."""
    from swin_rpe_plugin import SwinTransformerV2
    from swin_rpe_plugin.compat import _COMPILE_TRACES_WINDOW_PLAN
    torch.manual_seed(0)
    config = TINY if _COMPILE_TRACES_WINDOW_PLAN else dict(TINY, depths=(2, 1))
    model = SwinTransformerV2(**config, pretrained_window_size=(4, 4))
    with torch.no_grad():  # the reference init zeroes the post-norms: give every part values
        for p in model.parameters():
            p.normal_(0, 0.3)
    compiled = torch.compile(model)
    x = torch.randn(2, 3, 97, 131)
    model.eval()
    with torch.no_grad():
        for a, b in zip(model(x), compiled(x)):
            torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize('train', [False, True], ids=['eval', 'train'])
def test_compiled_graphs_do_not_grow_with_depth(train):
    """A graph break inside a block makes dynamo compile every block on its own (torch 2.1: 92
    recompiles of the tiny backbone in test_compiled_equals_eager_in_eval_and_train). The
    graphs of a compiled backbone are as many at depth 4 as at depth 2: one where the torch
    traces the window plan into the graph, else one more per eagerly built plan."""
    import torch._dynamo
    from swin_rpe_plugin.compat import _COMPILE_TRACES_WINDOW_PLAN
    x = torch.randn(2, 3, 97, 131)
    counts = []
    for depth in (2, 4):  # one stage: the loop over its blocks is where breaks multiply
        model = SwinTransformer(**dict(ONE_STAGE, depths=(depth,)), mask_padding=True).train(train)
        torch._dynamo.reset()
        with torch.set_grad_enabled(train):
            counts.append(torch._dynamo.explain(model)(x).graph_count)
    torch._dynamo.reset()
    assert counts[1] == counts[0], f'graphs at depth 2 and 4: {counts}'
    if _COMPILE_TRACES_WINDOW_PLAN:
        assert counts[0] == 1, f'{counts[0]} graphs: the backbone should compile to one'


@pytest.mark.parametrize('dtype', ['fp32', 'bf16'])
def test_generic_path_compiles_to_one_graph_without_recompiles(dtype):
    """The path GPUs run (``SWIN_RPE_BACKEND=generic``), in training, in float32 and under bf16
    autocast: where the torch traces the window plan (2.5+), one graph and no break, so no
    block or stage is compiled on its own (torch 2.11 broke in every block on an autocast query
    before it was read once: 27 graphs here); below, one more graph per eagerly built plan. A
    second step reuses the first one's graphs: no recompile."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    from swin_rpe_plugin.compat import _COMPILE_TRACES_WINDOW_PLAN
    from swin_rpe_plugin.ops.dispatch import force_backend
    x = torch.randn(2, 3, 97, 131)
    model = SwinTransformer(**TINY, mask_padding=True).train()
    autocast = torch.autocast('cpu', dtype=torch.bfloat16, enabled=dtype == 'bf16')
    torch._dynamo.reset()
    with force_backend('generic'), autocast:
        explained = torch._dynamo.explain(model)(x)
        if _COMPILE_TRACES_WINDOW_PLAN:
            assert (explained.graph_count, explained.graph_break_count) == (1, 0), \
                explained.break_reasons
        else:  # 2 stages x (shifted, unshifted) plans
            assert explained.graph_count <= 5, explained.break_reasons
        torch._dynamo.reset()
        counter = CompileCounter()
        compiled = torch.compile(model, backend=counter)
        for _ in range(2):
            sum(o.float().mean() for o in compiled(x)).backward()
    torch._dynamo.reset()
    assert counter.frame_count == explained.graph_count, counter.frame_count
