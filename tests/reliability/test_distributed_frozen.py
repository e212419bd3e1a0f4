"""frozen_stages under DistributedDataParallel without find_unused_parameters: 2 gloo processes
(torchrun), the backbone wrapped before ``train()`` as mmengine's Runner wraps it, drop path on.

mmdet 3.3's Swin freezes its stages in ``train()``, after DDP registered every parameter, and
the second step fails ("Expected to have finished reduction in the prior iteration ...",
mmdet #8208, #11570); the worker runs it too, so this test shows it reproduces the failure ours
must not have. Ours freezes from construction on: it trains, the frozen weights stay
bit-identical, the rest move and are equal across ranks, frozen modules stay in eval mode.
"""
import os
import subprocess
import sys

import pytest
import torch

from conftest import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CASES = [f'{arch}:{frozen}' for arch in ('v1', 'v2') for frozen in (-1, 0, 1, 3)]


@pytest.fixture(scope='module')
def ranks(tmp_path_factory):
    out = str(tmp_path_factory.mktemp('ddp_frozen'))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get('PYTHONPATH', '')]),
               OMP_NUM_THREADS='1')
    proc = subprocess.run(
        [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2',
         '--master_addr', '127.0.0.1', '--master_port', str(free_port()),
         os.path.join(HERE, 'ddp_frozen_worker.py'), out],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [torch.load(os.path.join(out, f'rank{r}.pt'), weights_only=True) for r in (0, 1)]


def test_mmdet_swin_fails_as_reported_upstream(ranks):
    for rank in ranks:
        assert 'Expected to have finished reduction' in (rank['mmdet:1']['error'] or '')


@pytest.mark.parametrize('case', CASES)
def test_frozen_stages_train_under_ddp(ranks, case):
    r0, r1 = ranks[0][case], ranks[1][case]
    assert r0['error'] is None and r1['error'] is None, (r0['error'], r1['error'])
    frozen_stages = int(case.split(':')[1])
    assert bool(r0['frozen']) == (frozen_stages >= 0)
    for name in r0['after']:
        # DDP averages the gradients: both ranks hold the same weights, bit for bit
        assert torch.equal(r0['after'][name], r1['after'][name]), name
        unchanged = torch.equal(r0['after'][name], r0['before'][name])
        if name in r0['frozen']:
            assert unchanged, f'{name} is frozen but moved'
        else:
            assert not unchanged, f'{name} is trainable but did not move'
    stage = f'stages.{frozen_stages - 1}.' if frozen_stages >= 1 else None
    assert not stage or any(n.startswith(stage) for n in r0['frozen'])
    assert not stage or stage.rstrip('.') in r0['eval']
