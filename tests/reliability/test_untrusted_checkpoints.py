"""Untrusted checkpoints: crafted pickles whose unpickling would write a file are refused on
every route a checkpoint reaches this package, and the file is never written.

tests/checkpoint/test_safety.py covers a ``torch.save`` zip file with an ``open(path, 'w')``
payload through ``load_pretrained`` and mmengine's ``load_checkpoint``. Here: other payloads
(``os.system``, ``exec``), other containers (a raw pickle, torch's legacy non-zip format, a
payload nested inside a real Runner checkpoint's message hub, a pickle named ``.safetensors``)
and the other routes (``init_cfg`` Pretrained, Runner ``load_from`` and ``resume``).
"""
import os
import pickle

import pytest
import torch

from conftest import tiny_runner
from swin_rpe_plugin import SwinTransformer
from swin_rpe_plugin.checkpoint import (UnsafeCheckpointError, allow_mmengine_checkpoints,
                                        load_pretrained, read_checkpoint)

TINY = dict(embed_dims=8, depths=(1, 1), num_heads=(1, 2), strides=(4, 2), window_size=4,
            out_indices=(0, 1), drop_path_rate=0.0)


class ShellPayload:
    """Unpickling runs ``touch <target>`` through os.system."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return (os.system, (f'touch {self.target}', ))


class ExecPayload:
    """Unpickling runs Python source that writes the target."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return (exec, (f'open({self.target!r}, "w").write("pwned")', ))


PAYLOADS = {'os.system': ShellPayload, 'exec': ExecPayload}


def write(path, obj, container):
    if container == 'zip':
        torch.save(obj, path)
    elif container == 'legacy':
        torch.save(obj, path, _use_new_zipfile_serialization=False)
    else:  # a bare pickle, no torch framing at all
        with open(path, 'wb') as f:
            pickle.dump(obj, f, protocol=2)


CONTAINERS = ['zip', 'legacy', 'raw-pickle']

def evil_checkpoint(tmp_path, payload, container):
    target = tmp_path / 'written'
    path = str(tmp_path / 'evil.pth')
    state = SwinTransformer(**TINY).state_dict()
    write(path, {'state_dict': state, 'meta': {'x': PAYLOADS[payload](target)}}, container)
    allow_mmengine_checkpoints()  # the allow-list must not open a door
    return path, target


@pytest.mark.parametrize('container', CONTAINERS)
@pytest.mark.parametrize('payload', sorted(PAYLOADS))
def test_payload_never_runs(tmp_path, container, payload):
    path, target = evil_checkpoint(tmp_path, payload, container)
    with pytest.raises((UnsafeCheckpointError, ValueError), match=r'evil\.pth'):
        read_checkpoint(path)
    model = SwinTransformer(**TINY, init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises((UnsafeCheckpointError, ValueError), match=r'evil\.pth'):
        model.init_weights()  # the route of init_cfg in every config
    assert not target.exists()


@pytest.mark.parametrize('container', CONTAINERS)
@pytest.mark.parametrize('payload', [
    'exec', 'os.system'])
def test_payload_is_reported_as_unsafe_with_the_opt_in(tmp_path, container, payload):
    path, target = evil_checkpoint(tmp_path, payload, container)
    with pytest.raises(UnsafeCheckpointError, match=r'refused to load .*evil\.pth.*allow_pickle'):
        read_checkpoint(path)
    assert not target.exists()


def test_pickle_disguised_as_safetensors_is_not_unpickled(tmp_path):
    target = tmp_path / 'written'
    path = str(tmp_path / 'evil.safetensors')
    write(path, {'state_dict': {}, 'x': ShellPayload(target)}, 'zip')
    with pytest.raises(ValueError, match=r'evil\.safetensors.*not a readable safetensors'):
        read_checkpoint(path)
    assert not target.exists()


def runner(work_dir, max_iters, **kwargs):
    return tiny_runner(work_dir, max_iters, TINY, 16, 1, **kwargs)


@pytest.mark.parametrize('resume', [False, True], ids=['load_from', 'resume'])
def test_payload_nested_in_a_runner_checkpoint_is_refused_by_the_runner(tmp_path, resume):
    allow_mmengine_checkpoints()
    runner(tmp_path / 'straight', 1).train()
    ckpt = read_checkpoint(str(tmp_path / 'straight' / 'iter_1.pth'))
    assert 'message_hub' in ckpt and 'optimizer' in ckpt
    target = tmp_path / 'written'
    ckpt['message_hub']['runtime_info']['note'] = ShellPayload(target)
    path = str(tmp_path / 'evil.pth')
    torch.save(ckpt, path)
    evil = runner(tmp_path / 'evil_run', 2, load_from=path, resume=resume)
    with pytest.raises(pickle.UnpicklingError, match='posix.system|Unsupported global'):
        evil.train()
    assert not target.exists()
    # The same checkpoint without the payload resumes: the refusal is the payload's.
    del ckpt['message_hub']['runtime_info']['note']
    torch.save(ckpt, path)
    clean = runner(tmp_path / 'clean_run', 2, load_from=path, resume=resume)
    clean.train()
    assert clean.iter == 2


# torch.serialization.safe_globals' exit removes its entries from the process-wide list even
# when allow_mmengine_checkpoints() had registered them before (fixed in a6c99fb).

@pytest.mark.needs('HAS_SAFE_GLOBALS')  # no process-wide allow-list below torch 2.4
def test_reading_a_checkpoint_keeps_the_process_wide_allow_list(tmp_path):
    from mmengine.logging import HistoryBuffer
    allow_mmengine_checkpoints()
    assert HistoryBuffer in torch.serialization.get_safe_globals()
    path = str(tmp_path / 'backbone.pth')
    torch.save({'state_dict': SwinTransformer(**TINY).state_dict()}, path)
    read_checkpoint(path)
    assert HistoryBuffer in torch.serialization.get_safe_globals()


def test_resume_with_a_pretrained_backbone(tmp_path):
    """init_weights (reading the backbone checkpoint) runs before resume: the Runner checkpoint
    must still be readable afterwards."""
    allow_mmengine_checkpoints()  # as tools/train.py does
    backbone = str(tmp_path / 'backbone.pth')
    torch.save({'state_dict': SwinTransformer(**TINY).state_dict()}, backbone)
    TINY_PRETRAINED = dict(type='Pretrained', checkpoint=backbone)
    first = runner(tmp_path / 'first', 1)
    first.model.backbone.init_cfg = TINY_PRETRAINED
    first.train()
    resumed = runner(tmp_path / 'resumed', 2, resume=True,
                     load_from=str(tmp_path / 'first' / 'iter_1.pth'))
    resumed.model.backbone.init_cfg = TINY_PRETRAINED
    resumed.train()
    assert resumed.iter == 2
