"""RNGStateHook's pieces: states survive a weights_only checkpoint; every config has the hook."""
import glob
import io
import os
import random

import numpy as np
import pytest
import torch
from mmengine.config import Config

from swin_rpe_plugin.engine.rng_state import capture_rng_state, restore_rng_state

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def draws():
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]


def test_states_round_trip_through_a_weights_only_checkpoint():
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    np.random.randn()  # leaves a cached Gaussian in numpy's state
    buffer = io.BytesIO()
    torch.save({'rng_state': capture_rng_state()}, buffer)
    expected = draws()
    torch.manual_seed(2), np.random.seed(2), random.seed(2)
    assert draws() != expected
    buffer.seek(0)
    restore_rng_state(torch.load(buffer, weights_only=True)['rng_state'])  # no pickled objects
    assert draws() == expected


@pytest.mark.parametrize('path', sorted(glob.glob(os.path.join(ROOT, 'configs', '*', '*.py'))),
                         ids=os.path.basename)
def test_every_config_has_the_hook(path):
    hooks = Config.fromfile(path).get('custom_hooks', [])
    assert dict(type='swin_rpe_plugin.RNGStateHook') in hooks, path
