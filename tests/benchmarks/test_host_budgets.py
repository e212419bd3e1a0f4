"""What a GPU's host pays per step on the generic path, against mmdet 3.3's Swin with the same
weights: Python calls and ATen operators dispatched at the top level (``benchmarks/host.py``).

At detection sizes a GPU step is bound by its host, and the host's work per step does not depend
on the device, the width or the image size: both backbones run here at Swin-T's depth (2, 2, 6,
2) with 16 channels on 64x64 images, drop path 0.2 as mmdet's Swin-T detection configs, with
``SWIN_RPE_BACKEND=generic`` (the path a GPU runs). How each count is taken:

- Python calls: ``sys.setprofile``'s 'call' and 'c_call' events of one step (forward, loss and
  backward; autograd runs a Function's Python backward in the calling thread on the CPU), after
  one warm-up step. Exact: the same on every CPU and at every run.
- Top-level ATen ops: the profiler's ``aten::`` events with no ``aten::`` ancestor, so each is
  one trip of Python code or an autograd node through the dispatcher: views, detaches and
  no-op casts count, an operator's internal calls do not. The relative position tables take no
  gradient in either model: the CPU's SDPA then runs its fused kernels both ways, as a GPU's
  does whether or not the bias takes a gradient (the CPU's math path for a bias gradient is
  ~13 ops a call that no GPU pays).

Measured 2026-12-05 (a6a0415; before it, 57855b8): train fp32 Python calls 2,345 (12,614) vs
mmdet's 3,866, ATen ops 1,281 (1,775) vs 2,359; infer fp32 1,438 (5,403) vs 3,768 and 315 (435)
vs 929; bf16 train 2,455 vs 3,881 and 1,406 vs 2,488, bf16 infer 1,642 vs 3,791.
2026-12-07, blocks reading their parts by attribute (no ``_modules``/``_parameters`` dicts, which
FSDP's parameter views break) and checking for forward hooks: Python calls train fp32 2,555
(0.66x), bf16 2,665 (0.69x), infer fp32 1,646 (0.44x), bf16 1,838 (0.48x); ATen ops unchanged.
2026-12-07, the CPU path joining the one block (``ops/block.py``: halves apart for with_cp,
kernels as functions): train fp32 2,683 (0.69x), bf16 2,801 (0.72x), infer fp32 1,772 (0.47x),
bf16 2,096 (0.55x); ATen ops train fp32 1,287 (0.55x), infer 321 (0.35x).
"""
import pytest
import torch

from benchmarks.host import (HOST_SHAPE, build_host_pair, count_python_calls,
                             count_top_level_ops, host_step)
from swin_rpe_plugin.ops.dispatch import force_backend

RATIOS = {('python_calls', 'train'): 0.8, ('python_calls', 'infer'): 0.8,
          ('aten_ops', 'train'): 0.6, ('aten_ops', 'infer'): 0.45}


def side_counts(step, x) -> dict:
    step(x)  # warm-up: plans and caches built
    return dict(python_calls=count_python_calls(step, x),
                aten_ops=sum(count_top_level_ops(step, x).values()))


def counts(models, mode: str, dtype: str, batches=(2, 8)) -> dict:
    """{batch: {side: {'python_calls': n, 'aten_ops': n}}} of one step after a warm-up."""
    stock, ours = models
    steps = {'mmdet': host_step(stock, mode, dtype), 'ours': host_step(ours, mode, dtype)}
    with force_backend('generic'):
        return {batch: {side: side_counts(step, torch.randn(batch, 3, *HOST_SHAPE))
                        for side, step in steps.items()} for batch in batches}


@pytest.fixture(scope='module')
def measured():
    models = build_host_pair()
    return {(mode, dtype, batch): sides for mode in ('train', 'infer')
            for dtype in ('fp32', 'bf16')
            for batch, sides in counts(models, mode, dtype).items()}


@pytest.mark.parametrize('dtype', ['fp32', 'bf16'])
@pytest.mark.parametrize('mode', ['train', 'infer'])
@pytest.mark.parametrize('what', ['python_calls', 'aten_ops'])
def test_host_work_per_step_is_a_fraction_of_mmdets(measured, mode, what, dtype):
    """Ours at most RATIOS x mmdet's at 2 and at 8 images, and the same count at both: no
    Python loop over images, windows or chunks. bf16: both under CPU autocast."""
    ours = {batch: measured[mode, dtype, batch]['ours'][what] for batch in (2, 8)}
    mmdet = {batch: measured[mode, dtype, batch]['mmdet'][what] for batch in (2, 8)}
    for batch in (2, 8):
        assert ours[batch] <= RATIOS[what, mode] * mmdet[batch], (batch, ours, mmdet)
    assert ours[2] == ours[8], ours


def test_python_calls_stay_a_fraction_of_mmdets_with_tables_that_train():
    """Trained tables, as in fine-tuning: each layer gathers its bias with autograd (and, on
    the CPU only, checks the index range once per index): still at most 0.8x mmdet's."""
    measured = counts(build_host_pair(freeze_tables=False), 'train', 'fp32', (2, ))[2]
    ours, mmdet = measured['ours']['python_calls'], measured['mmdet']['python_calls']
    assert ours <= RATIOS['python_calls', 'train'] * mmdet, (ours, mmdet)
