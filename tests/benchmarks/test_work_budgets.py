"""Budgets of the exact work of a Swin-T step (benchmarks/work.py), against mmdet's own Swin with
the same weights in the same run.

The counts do not depend on the CPU or on load, so a change that adds a pass over a tensor or
keeps one more for backward fails here on any machine. The kernel rules are forced to what
every CPU can run (MKL linears, fc1 + GELU by each library in float32, SDPA's flash kernel for the
attention forward, the bf16 attention backward in bf16 as on CPUs with native bf16), so the
counts are the same wherever the suite runs.
``BUDGETS`` holds our counts as measured when they were set: lower them when a change saves
bytes; raising one needs a reason in the commit. The generic path's were raised when it became
one SDPA call per layer (issue 44): a copy of qkv folds the windows of a shifted block into the
heads, bias + mask is summed per window, and SDPA's own autograd keeps what the device's kernel
keeps (on the CPU its math path: the probabilities), trading bytes for launches, which are what
a GPU pays for (tests/benchmarks/test_kernel_budgets.py). Its bf16 train step was raised again
when the bias gradients became one sum into float32 (one launch, where a CPU casts the whole
gradient first: the bytes counted here) and the output projections plain autograd (their weight
casts kept). When the generic path became one block of two Functions (issue 47: host work per step,
``ops/generic_block.py``, now ``ops/block.py``), its float32 train step moved 861 MB instead of 824
(q, k, v stay views of the projection in shifted blocks too, so their gradients are stacked and
copied back into its layout, 2 x 3C, where a folded copy took one; the bias is left a view and the
shift mask expanded over the images) and keeps less (71 MB against 76); at inference the peak rose
by one channel-width of stage 1 (the projection runs in window order before its gather back: 15.1 MB
against 13.9 in float32, 11.2 against 9.0 in bf16), for 8 fewer launches and a third
of the Python calls. When the CPU path joined that block (issue 53: one definition,
``ops/block.py``, its kernels a choice), its train steps moved 0.2 MB (float32) and 2.6 MB
(bf16) less and count 67 kB more kept (the plans' token indices, which the Functions hold and
the plan cache holds anyway); the float32 peak rose by 47 kB (0.03%), the bf16 one not. The
Functions recompute the LayerNorms' statistics with the norms in backward instead of keeping
them (8 bytes a token: 0.15 MB less kept on both paths). The generic
path's inference peak fell to the CPU path's (the qkv projection is let go before the FFN half:
9.6 MB against 15.1 in float32, 9.0 against 11.2 in bf16), and its bf16 inference moves 9.3 MB
less (the patch mergings' weight casts kept, as the blocks'). The ratio targets of issue 25 that
are met
are held below as ratios against mmdet's counts of the same run.
"""
import pytest
import torch

from benchmarks.backbone import backbone_work
from swin_rpe_plugin.ops import window_products
from swin_rpe_plugin.ops.dispatch import force_kernel

# (mode, dtype, the library of fc1 + GELU at inference): MKL (product, then GELU), the rule on
# AVX2 CPUs, and oneDNN's fused epilogue, the rule on AVX-512 CPUs in float32.
CASES = [('infer', 'fp32', 'onednn'), ('infer', 'fp32', 'mkl'), ('train', 'fp32', 'mkl'),
         ('infer', 'bf16', 'mkl'), ('train', 'bf16', 'mkl')]
# case -> side -> (bytes moved outside the products, kept for backward, allocator peak),
# Swin-T, 224 x 224, batch 1. No peak under oneDNN: its scratchpad, allocated through torch,
# is sized by the instruction set of the kernel it picks, so the peak would depend on the CPU.
BUDGETS = {
    ('infer', 'fp32', 'onednn'): {'ours': (150_605_316, None, None),
                                  'ours_generic': (264_063_148, None, 9_633_792)},
    ('infer', 'fp32', 'mkl'): {'ours': (242_196_996, None, 9_633_792),
                               'ours_generic': (264_063_148, None, 9_633_792)},
    ('train', 'fp32', 'mkl'): {'ours': (750_332_352, 63_262_136, 153_528_752),
                               'ours_generic': (861_351_848, 71_048_040, 158_887_784)},
    ('infer', 'bf16', 'mkl'): {'ours': (164_896_644, None, 9_031_680),
                               'ours_generic': (171_784_672, None, 9_031_680)},
    ('train', 'bf16', 'mkl'): {'ours': (1_060_274_880, 36_543_416, 136_397_256),
                               'ours_generic': (1_264_263_128, 56_620_392, 147_114_344)},
}


@pytest.fixture(scope='module')
def records():
    out = {}
    native = window_products.NATIVE_PRODUCTS[torch.bfloat16]
    window_products.NATIVE_PRODUCTS[torch.bfloat16] = True
    try:
        for mode, dtype, gelu in CASES:
            with force_kernel('linear', 'mkl'), force_kernel('linear_gelu', gelu), \
                    force_kernel('attention', 'flash'):
                out[mode, dtype, gelu] = backbone_work('tiny', (224, 224), 1, mode,
                                                       dtype)['sides']
    finally:
        window_products.NATIVE_PRODUCTS[torch.bfloat16] = native
    return out


@pytest.mark.parametrize('case', CASES, ids=' '.join)
@pytest.mark.parametrize('side', ['ours', 'ours_generic'])
def test_bytes_stay_within_their_budget(records, case, side):
    work = records[case][side]
    moved, kept, peak = BUDGETS[case][side]
    mode = case[0]
    assert work['bytes_outside'] <= moved, work['bytes_by_kind']
    if peak is not None:
        assert work['peak_bytes'] <= peak
    if mode == 'train':
        assert work['saved_bytes'] <= kept
    else:
        assert work['saved_bytes'] is None


def test_backward_keeps_no_weight_cast_of_the_recomputed_linears(records):
    """Autocast's autograd keeps the bf16 cast of every weight from forward to backward (2 bytes
    a parameter, as mmdet's side shows); ours keeps the weights themselves and casts again. The
    generic path's output projections are plain autograd (the Function only added host time
    there): their casts, 2.2M of Swin-T's 28M parameters, are all it keeps."""
    train = records[('train', 'bf16', 'mkl')]
    assert train['mmdet']['saved_weight_cast_bytes'] >= 2 * 27_000_000
    assert train['ours']['saved_weight_cast_bytes'] == 0
    proj = 2 * sum(c * c + c for c, depth in ((96, 2), (192, 2), (384, 6), (768, 2))
                   for _ in range(depth))
    assert train['ours_generic']['saved_weight_cast_bytes'] <= proj


def test_product_flops_are_mmdets_and_the_seed_tables(records, reference):
    """Inference: the same products as mmdet, 4.5 GMACs for Swin-T at 224 (the seed table).
    Training: mmdet's plus, on the CPU path, the one product the attention backward recomputes
    (q k^T), half the attention's forward products."""
    for dtype in ('fp32', 'bf16'):
        infer, train = records['infer', dtype, 'mkl'], records['train', dtype, 'mkl']
        assert infer['ours']['product_flops'] == infer['mmdet']['product_flops'] \
            == infer['ours_generic']['product_flops']
        assert round(infer['ours']['product_flops'] / 2e9, 1) == \
            reference['model_variants']['Swin-T']['GFLOPs_224']
        extra = train['ours']['product_flops'] - train['mmdet']['product_flops']
        assert 0 < extra < 0.01 * train['mmdet']['product_flops']
        # the generic path: SDPA's own backward (here its math path: mmdet's products)
        generic = train['ours_generic']['product_flops'] - train['mmdet']['product_flops']
        assert 0 <= generic < extra


@pytest.mark.parametrize('dtype', ['fp32', 'bf16'])
def test_inference_moves_at_most_half_of_mmdets_bytes(records, dtype):
    """Issue 25's target for inference on the CPU path: float32 with fc1's GELU in oneDNN's
    epilogue (the rule on AVX-512 CPUs; AVX2 CPUs take MKL's product and a GELU pass, which is
    faster there and moves what the generic path moves), bf16 with the weights' casts kept
    between calls, which the generic path shares."""
    infer = records[('infer', 'fp32', 'onednn') if dtype == 'fp32' else ('infer', dtype, 'mkl')]
    assert infer['ours']['bytes_outside'] <= 0.5 * infer['mmdet']['bytes_outside']
    if dtype == 'bf16':
        assert infer['ours_generic']['bytes_outside'] <= 0.5 * infer['mmdet']['bytes_outside']


def test_fc1_with_gelu_on_onednn_moves_nothing_outside_the_product():
    """The fused epilogue: bias and GELU inside the product, no pass over fc1's output."""
    from benchmarks.work import count_work
    from swin_rpe_plugin.ops import linear
    x, weight, bias = torch.randn(3136, 96), torch.randn(384, 96), torch.randn(384)
    with force_kernel('linear_gelu', 'onednn'), torch.no_grad():
        fused = count_work(lambda x: linear(x, weight, bias, gelu=True), x)
    # MKL's product for the unfused case on every CPU (the 'linear' rule names oneDNN, whose
    # epilogue adds the bias, on AMD AVX-512).
    with force_kernel('linear_gelu', 'mkl'), force_kernel('linear', 'mkl'), torch.no_grad():
        plain = count_work(lambda x: linear(x, weight, bias, gelu=True), x)
    out_bytes = 3136 * 384 * 4
    assert fused['bytes_outside'] == 0 and fused['product_flops'] == 2 * 3136 * 96 * 384
    # MKL: the bias copied in and read back by the product, then GELU reads and writes
    assert plain['bytes_outside'] == 2 * out_bytes + 384 * 4 + 2 * out_bytes


@pytest.mark.parametrize('mode', ['infer', 'train'])
def test_padded_windows_copy_no_map(mode):
    """At 96 x 96 every stage's map (24, 12, 6, 3) pads to whole windows. The window gathers
    write their few padding tokens in place (index_fill_) instead of copying the whole map
    with a zero row appended (constant_pad_nd), forward and backward, on both paths."""
    with force_kernel('linear', 'mkl'):
        sides = backbone_work('tiny', (96, 96), 1, mode, 'fp32', profiles=True)['sides']
    for side in ('ours', 'ours_generic'):
        by_op = sides[side]['by_op']
        assert not any(op.startswith('constant_pad_nd') for op in by_op), by_op
        assert by_op['index_fill_ (window gather/scatter)'] > 0
    assert any(op.startswith('constant_pad_nd') for op in sides['mmdet']['by_op'])
