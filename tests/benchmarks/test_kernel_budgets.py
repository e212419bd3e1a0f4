"""Kernels per step on the generic path (what a GPU runs), against mmdet 3.3's Swin with the same
weights: the aten operators that launch work (``benchmarks/work.py``), counted on the ``meta``
device, where the same ops run as on any device but the CPU's fast path, at any size, without
data. On a GPU each launch costs host time whatever its size, so at detection sizes this count,
not FLOPs or bytes, sets the step time (docs/performance.md).

SDPA is counted as the fused call a GPU makes (``FusedAttentionCounts``); the CPU and meta run
it as its math path, which the last test counts too. ``BUDGETS`` holds our counts as measured
when they were set: lower them when a change saves launches; raising one needs a reason in the
commit.
"""

import pytest
import torch

from benchmarks.backbone import build_pair, step_fn
from benchmarks.work import count_kernels
from swin_rpe_plugin.ops.dispatch import force_backend

# (mode) -> our Swin-T step's kernels at 2 images and more, any size
BUDGETS = {'train': 649, 'infer': 212}
SIZES = [((512, 512), 1), ((512, 512), 2), ((512, 512), 8), ((800, 1216), 2)]


@pytest.fixture(scope='module')
def models():
    stock, ours = build_pair('tiny')
    return stock.to('meta'), ours.to('meta')


def kernels(model, mode, shape, batch, **kwargs):
    x = torch.empty(batch, 3, *shape, device='meta')
    with force_backend('generic'):
        return count_kernels(step_fn(model, mode), x, **kwargs)


@pytest.mark.parametrize('mode', ['train', 'infer'])
def test_steps_launch_at_most_0_7x_mmdets_kernels_at_any_batch_and_size(models, mode):
    """Swin-T at 512x512 b1, b2, b8 and 800x1216 b2: ours at most 0.7x of mmdet's at every one,
    and the same count from 2 images on, at both sizes: no Python loop over images, windows or
    chunks (one image saves the sums of broadcast gradients over the batch, on both sides)."""
    stock, ours = models
    counts = {(shape, batch): (kernels(ours, mode, shape, batch)[0],
                               kernels(stock, mode, shape, batch)[0])
              for shape, batch in SIZES}
    for case, (ours_count, mmdet_count) in counts.items():
        assert ours_count <= 0.7 * mmdet_count, (case, ours_count, mmdet_count)
    many = {ours_count for (shape, batch), (ours_count, _) in counts.items() if batch > 1}
    assert many == {BUDGETS[mode]}, counts
    assert counts[(512, 512), 1][0] <= BUDGETS[mode]


def test_one_sdpa_call_per_attention_layer(models):
    """12 attention layers in Swin-T: 12 fused forward calls and 12 backward calls, at 8 images
    as at 2; no registered op of the CPU path."""
    _, ours = models
    for batch in (2, 8):
        by_op = kernels(ours, 'train', (512, 512), batch)[1]
        assert by_op['_scaled_dot_product_efficient_attention'] == 12
        assert by_op['_scaled_dot_product_efficient_attention_backward'] == 12
        assert not any('flash_attention_for_cpu' in op or '_softmax' in op for op in by_op)


def test_math_path_counts_are_batch_independent_too(models):
    """Counted as the CPU and meta run SDPA (its math path, when the mask needs a gradient):
    more operators, still none per image."""
    _, ours = models
    counts = [kernels(ours, 'train', shape, batch, fused_attention=False)[0]
              for shape, batch in SIZES[1:]]
    assert len(set(counts)) == 1 and counts[0] > BUDGETS['train']
