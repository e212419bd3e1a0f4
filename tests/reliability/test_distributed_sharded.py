"""Sharded training with torch's FSDP, 2 gloo processes (torchrun): FSDP1 with
``use_orig_params`` True and False, FSDP2's ``fully_shard``, each unit a Swin block
(``swin_rpe_plugin.engine.sharding``), stages frozen, with and without ``with_cp``, V1 and V2,
the CPU path and the generic one, float32 and bf16 autocast.

Before this, our backbone raised ``KeyError: 'relative_position_bias_table'`` under FSDP (its
forward read ``_parameters[...]``, which FSDP empties), and dropped the norms' gradients where it
read ``norm.parameters()`` (FSDP1 puts plain tensors in their place). Each case must train as
one process does on both ranks' images (float32: the same losses and weights), keep frozen
weights bit-identical, and infer after every step what an unsharded copy with the same weights
infers: what a backbone keeps between forwards (casts, gathered biases) must follow the weights
FSDP gathers anew.
"""
import os
import subprocess
import sys

import pytest
import torch

from conftest import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from fsdp_worker import CASES  # noqa: E402

pytestmark = pytest.mark.needs('FSDP_ON_CPU')  # torch 2.1's FSDP needs CUDA (compat.py)


@pytest.fixture(scope='module')
def ranks(tmp_path_factory):
    out = str(tmp_path_factory.mktemp('fsdp'))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get('PYTHONPATH', '')]),
               OMP_NUM_THREADS='1')
    proc = subprocess.run(
        [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2',
         '--master_addr', '127.0.0.1', '--master_port', str(free_port()),
         os.path.join(HERE, 'fsdp_worker.py'), out],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [torch.load(os.path.join(out, f'rank{r}.pt'), weights_only=True) for r in (0, 1)]


@pytest.mark.parametrize('case', [c[0] for c in CASES])
def test_sharded_training(ranks, case):
    r0, r1 = ranks[0][case], ranks[1][case]
    assert r0['error'] is None and r1['error'] is None, (r0['error'], r1['error'])
    assert r0['frozen'], 'every case freezes a stage'
    for name, weight in r0['weights'].items():
        assert torch.equal(weight, r1['weights'][name]), name  # one model, two shards
        unchanged = torch.equal(weight, r0['before'][name])
        assert unchanged == (name in r0['frozen']), f'{name}: frozen {name in r0["frozen"]}'
    reference = r0['reference']
    if reference is not None:  # float32: as one process training on both ranks' images
        for name, weight in reference['weights'].items():
            torch.testing.assert_close(r0['weights'][name], weight, rtol=1e-5, atol=1e-6)
        mean_loss = [(a + b) / 2 for a, b in zip(r0['losses'], r1['losses'])]
        torch.testing.assert_close(torch.stack(mean_loss), torch.stack(reference['losses']),
                                   rtol=1e-5, atol=1e-6)
    # The sharded units' weights are views at other offsets: products may round otherwise.
    assert len(r0['inferred']) == len(r0['unsharded']) == 3
    for sharded, unsharded in zip(r0['inferred'], r0['unsharded']):
        torch.testing.assert_close(sharded, unsharded, rtol=1e-4, atol=1e-4)
