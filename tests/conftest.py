import json
import os

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get('SWIN_RPE_SHARED', os.path.join(os.path.dirname(ROOT), 'shared'))


@pytest.fixture(scope='session')
def reference():
    """The worked numbers of the design documents (ground truth, never regenerated here)."""
    path = os.path.join(SHARED, 'reference', 'swin_rpe_reference.json')
    with open(path) as f:  # a missing file is a failure, not a skip
        return json.load(f)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
