"""Hooks the resume and distributed tests load into tools/train.py through ``custom_imports``
(tests/reliability is put on PYTHONPATH): one kills the process, one records what each rank saw.
"""
import hashlib
import json
import os
import signal

import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class KillAfterIteration(Hook):
    """SIGKILL this process right after (1-based) iteration ``iteration`` has updated the weights.

    Priority LOWEST: runs after CheckpointHook (VERY_LOW), so a checkpoint due at this iteration
    is written first; no checkpoint being due, the iteration's work is lost, as in a real kill.
    """
    priority = 'LOWEST'

    def __init__(self, iteration: int):
        self.iteration = iteration

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if runner.iter + 1 == self.iteration:
            os.kill(os.getpid(), signal.SIGKILL)


@HOOKS.register_module()
class RecordRank(Hook):
    """Write every rank's losses and RNG fingerprint (``losses_rank{r}.jsonl``) and final weights
    (``weights_rank{r}.pth``, and ``weights_init_rank{r}.pth`` before the first iteration) to
    the work dir: mmengine logs and saves rank 0 only."""
    priority = 'LOWEST'

    def before_train(self, runner):
        self._save(runner, 'weights_init')

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        # with a fingerprint of the torch stream this rank draws from next
        state = torch.get_rng_state().numpy().tobytes()
        record = {'iter': runner.iter + 1, 'torch_rng': hashlib.sha1(state).hexdigest()}
        record.update({k: float(v) for k, v in (outputs or {}).items()})
        path = os.path.join(runner.work_dir, f'losses_rank{get_rank()}.jsonl')
        with open(path, 'a') as f:
            f.write(json.dumps(record) + '\n')

    def after_train(self, runner):
        self._save(runner, 'weights')

    @staticmethod
    def _save(runner, name):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        if isinstance(runner.model, FSDP):  # the full tensors, gathered on every rank
            with FSDP.summon_full_params(runner.model):  # (copied before they are resharded)
                state = {k: v.detach().clone() for k, v in runner.model.named_parameters()}
                state.update((k, v.clone()) for k, v in runner.model.named_buffers())
        else:
            model = runner.model.module if hasattr(runner.model, 'module') else runner.model
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        torch.save(state, os.path.join(runner.work_dir, f'{name}_rank{get_rank()}.pth'))
