"""RNGStateHook: checkpoints carry the torch, numpy and Python RNG states, so a resumed run
draws what the uninterrupted run drew (drop path, dropout, random augmentations).

Add it to any config with one line::

    custom_hooks = [dict(type='swin_rpe_plugin.RNGStateHook')]

(our configs have it already). mmengine saves the seed but no generator state: a resumed run
re-seeds, replays the skipped batches through the dataloader (which restores the data
pipeline's numpy/Python draws) but not the model's torch draws, so stochastic layers diverge.

When the states are put back matters as much as saving them. They are saved with the weights,
right after an iteration (or epoch); the uninterrupted run draws next when it fetches the next
batch. So a resumed run restores them at that same point: after mmengine's replay of the
skipped batches (an iteration-based loop; the replay draws from numpy and Python) and after
``Runner.resume`` re-seeds when the config's seed differs from the checkpoint's. Validation
is made RNG-neutral in every run (states saved before it and restored after it): the
uninterrupted run validates after a checkpoint and the resumed one does not, so validation
must not move the training streams. ``load_from`` (fine-tuning, not resuming) restores nothing.

Distributed runs: every rank has its own streams (our tools seed rank r with seed + r,
docs/training.md), and only rank 0 writes checkpoints, so after each iteration the ranks'
states are gathered to rank 0 (a few KiB each) and saved as ``rng_state_per_rank``; on resume
rank r restores its own, when the world size is the one that saved them.

Not covered (docs/reliability-and-security.md): dataloader workers (``num_workers > 0``) draw from streams
seeded per worker at iterator creation, which a mid-epoch resume does not recreate the same way;
CUDA kernels that are nondeterministic unless ``randomness.deterministic=True``.
"""
import random
from typing import Optional

import numpy as np
import torch
from mmengine.dist import all_gather_object, get_rank, get_world_size
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.runner.loops import _InfiniteDataloaderIterator

from ..registry import HOOKS

__all__ = ['RNGStateHook', 'capture_rng_state', 'restore_rng_state']

KEY = 'rng_state'
PER_RANK_KEY = 'rng_state_per_rank'


def capture_rng_state() -> dict:
    """Every global generator's state as tensors and plain numbers (loads with
    ``weights_only=True``: no pickled numpy objects in the checkpoint)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, python_gauss = random.getstate()
    state = dict(torch=torch.get_rng_state(),
                 numpy=dict(kind=kind, keys=torch.from_numpy(keys.astype(np.int64)), pos=pos,
                            has_gauss=has_gauss, cached_gaussian=gauss),
                 python=dict(version=version, internal=torch.tensor(internal, dtype=torch.int64),
                             gauss=python_gauss))
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    torch.set_rng_state(state['torch'])
    n = state['numpy']
    np.random.set_state((n['kind'], n['keys'].numpy().astype(np.uint32), int(n['pos']),
                         int(n['has_gauss']), float(n['cached_gaussian'])))
    p = state['python']
    random.setstate((p['version'], tuple(int(v) for v in p['internal'].tolist()), p['gauss']))
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state['cuda'])


class _RestoreAfterReplay:
    """Stands in for the loop's data iterator: passes the ``replay`` skipped batches through,
    then restores the states just before the first batch that trains."""

    def __init__(self, loop, replay: int, state: dict):
        self.loop, self.inner, self.replay, self.state = loop, loop.dataloader_iterator, \
            replay, state

    def __iter__(self):
        return self

    def __next__(self):
        if self.replay > 0:
            self.replay -= 1
            return next(self.inner)
        restore_rng_state(self.state)
        self.loop.dataloader_iterator = self.inner
        return next(self.inner)


@HOOKS.register_module()
class RNGStateHook(Hook):
    """Save the RNG states in every checkpoint; restore them on resume (see the module doc)."""
    priority = 'VERY_HIGH'  # restore before any other hook's before_train could draw

    def __init__(self):
        self._pending: Optional[dict] = None
        self._before_val: Optional[dict] = None
        self._per_rank: Optional[list] = None

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        # Every rank, right after its iteration: rank 0 alone runs before_save_checkpoint.
        if get_world_size() > 1:
            self._per_rank = all_gather_object(capture_rng_state())

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        if self._per_rank is not None:
            checkpoint[PER_RANK_KEY] = self._per_rank
            checkpoint[KEY] = self._per_rank[0]
        else:
            checkpoint[KEY] = capture_rng_state()

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        state = checkpoint.get(KEY)
        per_rank = checkpoint.get(PER_RANK_KEY)
        if per_rank is not None and len(per_rank) == get_world_size():
            state = per_rank[get_rank()]
        elif get_world_size() > 1 and state is not None:
            print_log(f'RNGStateHook: the checkpoint holds the RNG states of '
                      f'{len(per_rank or [None])} rank(s), this run has {get_world_size()}: '
                      'every rank restores rank 0\'s, so the resumed run draws other random '
                      'numbers than the uninterrupted one', logger='current', level=30)
        if state is None:
            print_log('RNGStateHook: the checkpoint has no RNG states (saved without this hook): '
                      'a resumed run draws other random numbers than the uninterrupted one',
                      logger='current', level=30)
            return
        meta = checkpoint.get('meta', {})
        self._pending = dict(state=state, iter=meta.get('iter'), epoch=meta.get('epoch'))

    def before_train(self, runner) -> None:
        pending, self._pending = self._pending, None
        loop = runner.train_loop
        if pending is None or (pending['iter'], pending['epoch']) != (loop.iter, loop.epoch):
            return  # nothing loaded, or load_from (fine-tuning starts at 0): the seed rules
        if isinstance(getattr(loop, 'dataloader_iterator', None), _InfiniteDataloaderIterator) \
                and loop.iter > 0:
            loop.dataloader_iterator = _RestoreAfterReplay(loop, loop.iter, pending['state'])
        else:
            restore_rng_state(pending['state'])

    def before_val(self, runner) -> None:
        self._before_val = capture_rng_state()

    def after_val(self, runner) -> None:
        if self._before_val is not None:
            restore_rng_state(self._before_val)
            self._before_val = None
