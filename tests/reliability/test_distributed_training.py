"""Fine-tuning as users run it: tools/dist_train.sh, 2 gloo processes, our tiny backbone in the
generated-data Mask R-CNN and UPerNet configs, the first stage frozen, drop path on, no
``find_unused_parameters`` (mmdet 3.3's Swin fails here on the second iteration, see
test_distributed_frozen.py):

- Mask R-CNN with ``with_cp=True`` and bf16 AMP (``--amp``);
- UPerNet in float32, then resumed from rank 0's checkpoint at iteration 2 of 3;
- UPerNet sharded (mmengine's FlexibleRunner, our FSDPStrategy, a unit per Swin block), then
  resumed from the ranks' shards at iteration 2.

What a user relies on: the run finishes with finite losses; both ranks hold the same weights
afterwards; the frozen weights are the initial ones, bit for bit; each rank draws its own random
numbers (drop path); and the resumed run ends on exactly the uninterrupted run's weights (every
rank's RNG states travel in rank 0's checkpoint).
"""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from conftest import free_port
from swin_rpe_plugin import compat
from swin_rpe_plugin.datasets import make_synthetic_data

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ITERS = 3
CONFIGS = {
    'mask-rcnn': ('configs/synthetic/mask-rcnn_swin-rpe-tiny_fpn_shapes.py',
                  'swin_rpe_plugin.datasets.coco_shapes', 'coco', True),
    'upernet': ('configs/synthetic/upernet_swin-rpe-tiny_shapes-128x128.py',
                'swin_rpe_plugin.datasets.ade_shapes', 'ade', False),
}
RESUMED = ('upernet',)
if compat.FSDP_ON_CPU:  # torch 2.1's FSDP needs CUDA (compat.py)
    CONFIGS['upernet-fsdp'] = ('configs/synthetic/upernet_swin-rpe-tiny_shapes-128x128_fsdp.py',
                               'swin_rpe_plugin.datasets.ade_shapes', 'ade', False)
    RESUMED += ('upernet-fsdp',)
CONFIG = """
_base_ = [{base!r}]
custom_imports = dict(imports=['swin_rpe_plugin', {dataset!r}, 'reliability_hooks'],
                      allow_failed_imports=False)
model = dict(backbone=dict(frozen_stages=1, drop_path_rate=0.3, with_cp={with_cp}))
train_dataloader = dict(batch_size=2)
train_cfg = dict(max_iters={iters}, val_interval=100)
val_cfg = None
val_dataloader = None
val_evaluator = None
param_scheduler = []
default_hooks = dict(checkpoint=dict(interval=2, max_keep_ckpts=-1), logger=dict(interval=1))
custom_hooks = [dict(type='swin_rpe_plugin.RNGStateHook'), dict(type='RecordRank')]
"""
BN_STATISTICS = ('running_mean', 'running_var', 'num_batches_tracked')
FROZEN = ('backbone.patch_embed.', 'backbone.stages.0.', 'backbone.norm0.')


def dist_train(config, work_dir, data_root, *options):
    env = dict(os.environ, PYTHON=sys.executable, PORT=str(free_port()), OMP_NUM_THREADS='1',
               PYTHONPATH=os.pathsep.join([HERE, ROOT, os.environ.get('PYTHONPATH', '')]))
    proc = subprocess.run(['bash', 'tools/dist_train.sh', config, '2', '--work-dir', work_dir,
                           '--data-root', data_root, *options],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'rank 1/2: training finished' in proc.stdout


def records(work_dir, rank):
    with open(os.path.join(work_dir, f'losses_rank{rank}.jsonl')) as f:
        return [json.loads(line) for line in f]


def weights(work_dir, rank, name='weights'):
    return torch.load(os.path.join(work_dir, f'{name}_rank{rank}.pth'), weights_only=True)


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('dist_train')
    data = str(tmp / 'data')
    make_synthetic_data(data, num_train=8, num_val=2, seed=1, progress=False)
    done = {}
    for name, (base, dataset, folder, amp) in CONFIGS.items():
        config = str(tmp / f'{name}.py')
        with open(config, 'w') as f:
            f.write(CONFIG.format(base=os.path.join(ROOT, base), dataset=dataset,
                                  with_cp=amp, iters=ITERS))
        work_dir = str(tmp / name)
        dist_train(config, work_dir, os.path.join(data, folder), *(['--amp'] if amp else []))
        done[name] = work_dir
    for name in RESUMED:  # iter_2.pth: a file, or the folder of the ranks' shards
        resumed = str(tmp / f'{name}-resumed')
        dist_train(str(tmp / f'{name}.py'), resumed, os.path.join(data, 'ade'), '--resume',
                   os.path.join(done[name], 'iter_2.pth'))
        done[f'{name}-resumed'] = resumed
    return done


@pytest.mark.parametrize('name', list(CONFIGS))
def test_trains_with_finite_losses_and_one_set_of_weights(runs, name):
    for rank in (0, 1):
        losses = records(runs[name], rank)
        assert [r['iter'] for r in losses] == list(range(1, ITERS + 1))
        assert all(math.isfinite(v) for r in losses for k, v in r.items() if 'loss' in k)
    w0, w1 = weights(runs[name], 0), weights(runs[name], 1)
    assert w0.keys() == w1.keys()
    for key in w0:
        # BatchNorm's statistics (the heads' SyncBN is BN without CUDA) are each rank's own
        # after its last forward: DDP broadcasts rank 0's buffers at the start of the next
        # one, FSDP never
        if not key.endswith(BN_STATISTICS):
            assert torch.equal(w0[key], w1[key]), key


@pytest.mark.parametrize('name', list(CONFIGS))
def test_the_frozen_stage_keeps_its_initial_weights(runs, name):
    init, final = weights(runs[name], 0, 'weights_init'), weights(runs[name], 0)
    frozen = [k for k in init if k.startswith(FROZEN)]
    trained = [k for k in init if k.startswith('backbone.stages.1.') and 'weight' in k]
    assert frozen and trained
    for key in frozen:
        assert torch.equal(init[key], final[key]), key
    assert all(not torch.equal(init[key], final[key]) for key in trained)


@pytest.mark.parametrize('name', list(CONFIGS))
def test_each_rank_draws_its_own_random_numbers(runs, name):
    first = [records(runs[name], rank)[0]['torch_rng'] for rank in (0, 1)]
    assert first[0] != first[1]
    if name.endswith('-fsdp'):
        # shards load only into as many processes as saved them: that the ranks' states
        # travel is shown by the exact resume below
        return
    checkpoint = torch.load(os.path.join(runs[name], 'iter_2.pth'), weights_only=False)
    per_rank = checkpoint['rng_state_per_rank']
    assert len(per_rank) == 2
    assert not torch.equal(per_rank[0]['torch'], per_rank[1]['torch'])


@pytest.mark.parametrize('name', RESUMED)
def test_resuming_from_rank_0s_checkpoint_ends_where_the_run_did(runs, name):
    uninterrupted, resumed = runs[name], runs[f'{name}-resumed']
    assert [r['iter'] for r in records(resumed, 1)] == [ITERS]
    for rank in (0, 1):
        assert records(resumed, rank)[-1] == records(uninterrupted, rank)[-1]
        a, b = weights(uninterrupted, rank), weights(resumed, rank)
        for key in a:
            assert torch.equal(a[key], b[key]), key
