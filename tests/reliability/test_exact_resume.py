"""Exact resume: tools/train.py on the tiny UperNet and the synthetic set, killed with SIGKILL
one iteration after a checkpoint and resumed with ``--resume``, ends with the weights, optimizer
state, losses and iteration count of an uninterrupted run of the same length, bit for bit.

What makes bitwise equality possible on CPU: the same seed (model init, sampler), the same ops
in the same order (deterministic algorithms on), and mmengine's resume restoring the optimizer,
schedulers and message hub and replaying the skipped batches through the dataloader (so the
pipeline's numpy draws for RandomFlip match). mmengine does not checkpoint torch's RNG state, so
layers that draw from it during training (drop path, dropout) take other draws after a resume:
they are switched off here (see docs/reliability.md).
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from swin_rpe_plugin.datasets import make_synthetic_data

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SEG = os.path.join(ROOT, 'configs/synthetic/upernet_swin-rpe-tiny_shapes-128x128.py')
ITERS, INTERVAL, KILL_AT = 6, 2, 3

CONFIG = """
_base_ = [{seg!r}]
custom_imports = dict(imports=['swin_rpe_plugin', 'swin_rpe_plugin.datasets.ade_shapes',
                               'reliability_hooks'], allow_failed_imports=False)
model = dict(backbone=dict(drop_path_rate=0.0), decode_head=dict(dropout_ratio=0.0),
             auxiliary_head=dict(dropout_ratio=0.0))
randomness = dict(seed=0, deterministic=True)
train_dataloader = dict(batch_size=2, dataset=dict(data_root={data!r}))
train_cfg = dict(max_iters={iters}, val_interval={iters})
val_cfg = None
val_dataloader = None
val_evaluator = None
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=2),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=2, end={iters}, by_epoch=False)]
default_hooks = dict(checkpoint=dict(interval={interval}, max_keep_ckpts=10),
                     logger=dict(interval=1))
custom_hooks = {hooks}
"""


def write_config(path, data, hooks):
    with open(path, 'w') as f:
        f.write(CONFIG.format(seg=SEG, data=os.path.join(data, 'ade'), iters=ITERS,
                              interval=INTERVAL, hooks=hooks))
    return path


def train(config, work_dir, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [HERE, ROOT, os.environ.get('PYTHONPATH', '')]))
    return subprocess.run([sys.executable, 'tools/train.py', config, '--work-dir', work_dir,
                           *args], cwd=ROOT, capture_output=True, text=True, env=env)


def losses(work_dir):
    """The last record of each iteration (a resumed run repeats the killed iteration)."""
    with open(os.path.join(work_dir, 'losses_rank0.jsonl')) as f:
        return {r['iter']: r for r in map(json.loads, f)}


def checkpoint(path):
    return torch.load(path, map_location='cpu', weights_only=False)  # written by this test


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('resume')
    data = str(tmp / 'data')
    make_synthetic_data(data, num_train=8, num_val=2, seed=1, progress=False)
    record = "[dict(type='RecordRank')]"
    plain = write_config(str(tmp / 'plain.py'), data, record)
    killing = write_config(str(tmp / 'killing.py'), data,
                           f"[dict(type='RecordRank'), dict(type='KillAfterIteration', "
                           f"iteration={KILL_AT})]")
    straight, resumed = str(tmp / 'straight'), str(tmp / 'resumed')
    proc = train(plain, straight)
    assert proc.returncode == 0, proc.stderr[-3000:]
    killed = train(killing, resumed)
    assert killed.returncode == -9, (killed.returncode, killed.stderr[-3000:])  # SIGKILL
    killed_losses = losses(resumed)
    proc = train(plain, resumed, '--resume')  # 'auto': the latest checkpoint in the work dir
    assert proc.returncode == 0, proc.stderr[-3000:]
    return straight, resumed, killed_losses, proc.stdout + proc.stderr


def test_killed_run_left_a_checkpoint_and_lost_the_next_iteration(runs):
    _, resumed, killed_losses, log = runs
    assert sorted(killed_losses) == list(range(1, KILL_AT + 1))
    assert f'Load checkpoint from {resumed}/iter_{INTERVAL}.pth' in log or \
        f'resumed epoch: 0, iter: {INTERVAL}' in log


def test_resumed_run_ends_with_the_weights_of_the_straight_run(runs):
    straight, resumed, _, _ = runs
    a = checkpoint(os.path.join(straight, f'iter_{ITERS}.pth'))
    b = checkpoint(os.path.join(resumed, f'iter_{ITERS}.pth'))
    assert a['meta']['iter'] == b['meta']['iter'] == ITERS
    assert a['state_dict'].keys() == b['state_dict'].keys()
    diff = max((a['state_dict'][k].float() - b['state_dict'][k].float()).abs().max().item()
               for k in a['state_dict'])
    start = checkpoint(os.path.join(straight, f'iter_{INTERVAL}.pth'))['state_dict']
    moved = max((a['state_dict'][k] - v).abs().max().item()
                for k, v in start.items() if k.startswith('backbone.'))
    print(f'\nresume: {ITERS} iterations straight vs killed after {KILL_AT} (checkpoint at '
          f'{INTERVAL}) and resumed: max abs weight diff {diff:.3g} (backbone weights moved by '
          f'up to {moved:.3g} over iterations {INTERVAL + 1}-{ITERS})')
    assert moved > 0  # the resumed stretch did train
    assert diff == 0.0
    for sa, sb in zip(a['optimizer']['state'].values(), b['optimizer']['state'].values()):
        for key in sa:
            assert torch.equal(torch.as_tensor(sa[key]), torch.as_tensor(sb[key])), key


def test_resumed_run_repeats_the_lost_iteration_and_the_losses(runs):
    straight, resumed, killed_losses, _ = runs
    a, b = losses(straight), losses(resumed)
    assert sorted(a) == sorted(b) == list(range(1, ITERS + 1))
    assert b == a  # every loss term of every iteration, the replayed one included
    assert killed_losses[KILL_AT] == a[KILL_AT]  # the lost iteration computed the same
