"""Exact resume: tools/train.py on the tiny UperNet and the synthetic set, killed with SIGKILL
one iteration after a checkpoint and resumed with ``--resume``, ends with the weights, optimizer
state, losses and iteration count of an uninterrupted run of the same length, bit for bit.

Drop path (0.2), attention dropout (0.1) and the heads' dropout are on: they draw from torch's
RNG during training, which mmengine does not checkpoint. ``swin_rpe_plugin.RNGStateHook`` puts
the torch, numpy and Python states in every checkpoint and restores them where the straight run
drew next (after mmengine replays the skipped batches). The same run resumed without the hook
diverges, which shows the test can tell. Two straight runs in two processes with one seed end
bit for bit equal too: kernel choices are a rule, not a measurement (``ops/dispatch.py``).
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from swin_rpe_plugin.datasets import make_synthetic_data

pytestmark = pytest.mark.heavy  # minutes: scheduled first (tests/conftest.py)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SEG = os.path.join(ROOT, 'configs/synthetic/upernet_swin-rpe-tiny_shapes-128x128.py')
ITERS, INTERVAL, KILL_AT = 4, 2, 3

CONFIG = """
_base_ = [{seg!r}]
custom_imports = dict(imports=['swin_rpe_plugin', 'swin_rpe_plugin.datasets.ade_shapes',
                               'reliability_hooks'], allow_failed_imports=False)
model = dict(backbone=dict(drop_path_rate=0.2, attn_drop_rate=0.1))
randomness = dict(seed=0, deterministic={deterministic})
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


def write_config(path, data, hooks, deterministic=True):
    with open(path, 'w') as f:
        f.write(CONFIG.format(seg=SEG, data=os.path.join(data, 'ade'), iters=ITERS,
                              interval=INTERVAL, hooks=hooks, deterministic=deterministic))
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


RNG = "dict(type='swin_rpe_plugin.RNGStateHook')"
KILL = f"dict(type='KillAfterIteration', iteration={KILL_AT})"


def killed_and_resumed(tmp, data, name, hooks):
    """Train to KILL_AT, SIGKILL, resume to ITERS; returns (work dir, losses before the kill,
    log of the resumed process)."""
    killing = write_config(str(tmp / f'{name}_killing.py'), data, f"[{', '.join(hooks + [KILL])}]")
    plain = write_config(str(tmp / f'{name}.py'), data, f"[{', '.join(hooks)}]")
    work = str(tmp / name)
    killed = train(killing, work)
    assert killed.returncode == -9, (killed.returncode, killed.stderr[-3000:])  # SIGKILL
    killed_losses = losses(work)
    proc = train(plain, work, '--resume')  # 'auto': the latest checkpoint in the work dir
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work, killed_losses, proc.stdout + proc.stderr


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('resume')
    data = str(tmp / 'data')
    make_synthetic_data(data, num_train=8, num_val=2, seed=1, progress=False)
    hooks = ["dict(type='RecordRank')", RNG]
    straight = str(tmp / 'straight')
    proc = train(write_config(str(tmp / 'plain.py'), data, f"[{', '.join(hooks)}]"), straight)
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed, killed_losses, log = killed_and_resumed(tmp, data, 'resumed', hooks)
    return straight, resumed, killed_losses, log, tmp, data


def weight_diff(a, b):
    assert a['state_dict'].keys() == b['state_dict'].keys()
    return max((a['state_dict'][k].float() - b['state_dict'][k].float()).abs().max().item()
               for k in a['state_dict'])


def test_killed_run_left_a_checkpoint_and_lost_the_next_iteration(runs):
    _, resumed, killed_losses, log, _, _ = runs
    assert sorted(killed_losses) == list(range(1, KILL_AT + 1))
    assert f'Load checkpoint from {resumed}/iter_{INTERVAL}.pth' in log or \
        f'resumed epoch: 0, iter: {INTERVAL}' in log


def test_resumed_run_ends_with_the_weights_of_the_straight_run(runs):
    straight, resumed = runs[:2]
    a = checkpoint(os.path.join(straight, f'iter_{ITERS}.pth'))
    b = checkpoint(os.path.join(resumed, f'iter_{ITERS}.pth'))
    assert a['meta']['iter'] == b['meta']['iter'] == ITERS
    assert set(a['rng_state']) >= {'torch', 'numpy', 'python'}
    diff = weight_diff(a, b)
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
    straight, resumed, killed_losses = runs[:3]
    a, b = losses(straight), losses(resumed)
    assert sorted(a) == sorted(b) == list(range(1, ITERS + 1))
    assert b == a  # every loss term of every iteration, the replayed one included
    assert killed_losses[KILL_AT] == a[KILL_AT]  # the lost iteration computed the same


def test_without_the_hook_the_resumed_run_diverges(runs):
    """The control: mmengine alone re-seeds on resume, so drop path draws differ after it."""
    straight, _, _, _, tmp, data = runs
    resumed, _, _ = killed_and_resumed(tmp, data, 'no_hook', ["dict(type='RecordRank')"])
    a, b = losses(straight), losses(resumed)
    assert all(a[i] == b[i] for i in range(1, INTERVAL + 1))  # same until the checkpoint
    assert any(a[i] != b[i] for i in range(INTERVAL + 1, ITERS + 1))
    assert weight_diff(checkpoint(os.path.join(straight, f'iter_{ITERS}.pth')),
                       checkpoint(os.path.join(resumed, f'iter_{ITERS}.pth'))) > 0


@pytest.mark.parametrize('deterministic', [False, True])
def test_two_processes_with_one_seed_train_the_same_weights(runs, deterministic):
    """Two fresh processes, the same config and seed: bitwise the same losses and weights, with
    and without mmengine's ``randomness.deterministic`` (the kernel rule needs neither)."""
    straight, _, _, _, tmp, data = runs
    config = write_config(str(tmp / f'again_{deterministic}.py'), data,
                          "[dict(type='RecordRank')]", deterministic=deterministic)
    again = str(tmp / f'again_{deterministic}')
    proc = train(config, again)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert losses(again) == losses(straight)
    assert weight_diff(checkpoint(os.path.join(straight, f'iter_{ITERS}.pth')),
                       checkpoint(os.path.join(again, f'iter_{ITERS}.pth'))) == 0.0
