"""Distributed equivalence: tools/dist_train.sh with 2 gloo processes of batch b trains the tiny
UperNet exactly as tools/train.py with 1 process of batch 2b, up to float32 summation order.

Why the two should agree: with shuffle off, InfiniteSampler gives rank r the samples r, r + 2,
... of the single process's batch, so both see the same 2b images per iteration; the loss is a
mean over the b * H * W pixels of each process, and DDP averages the two processes' gradients,
which is the gradient of the mean over 2b images. What would break it, and is switched off:
- BatchNorm: without CUDA there is no SyncBN (torch's SyncBatchNorm is GPU-only and the tools
  turn SyncBN into BN), so each process would normalise over its own b images. The heads use
  GroupNorm here; the backbone has LayerNorm only, which is per token.
- Draws from the RNG (drop path, dropout, RandomFlip): every rank has the same seed, so rank 1
  would repeat rank 0's draws where the single process draws afresh for each image.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import free_port
from swin_rpe_plugin.datasets import make_synthetic_data

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SEG = os.path.join(ROOT, 'configs/synthetic/upernet_swin-rpe-tiny_shapes-128x128.py')
ITERS, B = 3, 2

CONFIG = """
_base_ = [{seg!r}]
custom_imports = dict(imports=['swin_rpe_plugin', 'swin_rpe_plugin.datasets.ade_shapes',
                               'reliability_hooks'], allow_failed_imports=False)
gn = dict(type='GN', num_groups=8, requires_grad=True)
model = dict(backbone=dict(drop_path_rate=0.0),
             decode_head=dict(dropout_ratio=0.0, norm_cfg=gn),
             auxiliary_head=dict(dropout_ratio=0.0, norm_cfg=gn))
randomness = dict(seed=0, deterministic=True)
train_dataloader = dict(
    batch_size={batch}, sampler=dict(type='InfiniteSampler', shuffle=False),
    dataset=dict(data_root={data!r}, pipeline=[
        dict(type='LoadImageFromFile'), dict(type='LoadAnnotations', reduce_zero_label=True),
        dict(type='PackSegInputs')]))
train_cfg = dict(max_iters={iters}, val_interval={iters})
val_cfg = None
val_dataloader = None
val_evaluator = None
param_scheduler = []
optim_wrapper = dict(_delete_=True, type='OptimWrapper',
                     optimizer=dict(type='SGD', lr=0.01, momentum=0.9))
default_hooks = dict(checkpoint=dict(interval={iters}), logger=dict(interval=1))
custom_hooks = [dict(type='RecordRank')]
"""


def losses(work_dir, rank):
    with open(os.path.join(work_dir, f'losses_rank{rank}.jsonl')) as f:
        return [json.loads(line) for line in f]


def weights(work_dir, rank, when='final'):
    name = f'weights_rank{rank}.pth' if when == 'final' else f'weights_init_rank{rank}.pth'
    return torch.load(os.path.join(work_dir, name), weights_only=True)


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('dist')
    data = os.path.join(str(tmp), 'data')
    make_synthetic_data(data, num_train=8, num_val=2, seed=1, progress=False)
    env = dict(os.environ, PYTHON=sys.executable, PORT=str(free_port()),
               PYTHONPATH=os.pathsep.join([HERE, ROOT, os.environ.get('PYTHONPATH', '')]))
    configs = {}
    for name, batch in (('single', 2 * B), ('dist', B)):
        configs[name] = str(tmp / f'{name}.py')
        with open(configs[name], 'w') as f:
            f.write(CONFIG.format(seg=SEG, data=os.path.join(data, 'ade'), batch=batch,
                                  iters=ITERS))
    single, dist = str(tmp / 'single'), str(tmp / 'dist')
    proc = subprocess.run([sys.executable, 'tools/train.py', configs['single'], '--work-dir',
                           single], cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = subprocess.run(['bash', 'tools/dist_train.sh', configs['dist'], '2', '--work-dir',
                           dist], cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'rank 1/2: training finished' in proc.stdout
    return single, dist


def test_both_ranks_hold_the_same_weights(runs):
    _, dist = runs
    w0, w1 = weights(dist, 0), weights(dist, 1)
    for key in w0:
        assert torch.equal(w0[key], w1[key]), key


def test_two_processes_of_b_match_one_process_of_2b(runs):
    single, dist = runs
    one = losses(single, 0)
    two = list(zip(losses(dist, 0), losses(dist, 1)))
    assert [r['iter'] for r in one] == list(range(1, ITERS + 1))
    loss_diff = 0.0
    for r, (r0, r1) in zip(one, two):
        for key in r:
            if 'loss' in key:  # acc_seg counts non-ignored pixels: not a mean over ranks
                loss_diff = max(loss_diff, abs(r[key] - (r0[key] + r1[key]) / 2))
    a, b, init = weights(single, 0), weights(dist, 0), weights(single, 0, 'init')
    assert all(torch.equal(init[k], v) for k, v in weights(dist, 0, 'init').items())
    weight_diff = moved = 0.0
    for key in a:
        weight_diff = max(weight_diff, (a[key].float() - b[key].float()).abs().max().item())
        moved = max(moved, (a[key].float() - init[key].float()).abs().max().item())
    print(f'\ndistributed: 2 gloo processes x batch {B} vs 1 process x batch {2 * B}, {ITERS} '
          f'SGD iterations: max abs diff of losses {loss_diff:.3g}, of weights '
          f'{weight_diff:.3g} (weights moved by up to {moved:.3g}); first-iteration loss '
          f'{one[0]["loss"]:.6f}')
    # float32 sums in another order: a few ulps of a loss of ~2 (ulp 2.4e-7), and weight
    # differences a ten-thousandth of the distance the weights travelled (SGD, unlike Adam,
    # passes a gradient difference through at its own scale, so a sum-instead-of-mean or a
    # rank that trained on other images would show at the scale of `moved`).
    assert moved > 1e-3
    assert loss_diff < 1e-5
    assert weight_diff < 1e-4 * moved
