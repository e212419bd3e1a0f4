"""Safe loading: mmengine Runner checkpoints through the allow-list, code payloads refused,
and one clear error for each kind of bad input."""
import os

import pytest
import torch
from mmengine.runner import load_checkpoint

from conftest import TinyClassifier, tiny_runner
from swin_rpe_plugin import SwinTransformer
from swin_rpe_plugin.checkpoint import (UnsafeCheckpointError, allow_mmengine_checkpoints,
                                        load_pretrained, read_checkpoint)

TINY = dict(embed_dims=16, depths=(1, 1), num_heads=(1, 2), strides=(4, 2), window_size=4,
            out_indices=(0, 1), drop_path_rate=0.0)


def runner(work_dir, max_iters, **kwargs):
    return tiny_runner(work_dir, max_iters, TINY, 32, 2, **kwargs)


@pytest.fixture(scope='module')
def runner_checkpoint(tmp_path_factory):
    work_dir = tmp_path_factory.mktemp('runner')
    trained = runner(work_dir, 2)
    trained.train()
    path = os.path.join(work_dir, 'iter_2.pth')
    return path, {k: v.clone() for k, v in trained.model.state_dict().items()}


@pytest.mark.needs('HAS_SAFE_GLOBALS')  # torch's own allow-list, and refusal, came in 2.4
def test_runner_checkpoint_holds_objects_torch_refuses_by_default(runner_checkpoint):
    path, _ = runner_checkpoint
    registered = torch.serialization.get_safe_globals()  # importing the package adds ours
    torch.serialization.clear_safe_globals()
    try:
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    finally:
        torch.serialization.add_safe_globals(registered)
    assert 'mmengine.logging.history_buffer.HistoryBuffer' in unsafe
    assert any(name.startswith('numpy') for name in unsafe)


def test_our_loader_reads_runner_checkpoint_safely(runner_checkpoint):
    path, state = runner_checkpoint
    ckpt = read_checkpoint(path)
    assert ckpt['message_hub']['log_scalars']['train/loss'].current() > 0
    model = SwinTransformer(**TINY)
    report = load_pretrained(model, path)
    assert report.format == 'mmdet' and sorted(report.ignored) == ['head.bias', 'head.weight']
    for key, value in model.state_dict().items():
        assert torch.equal(value, state['backbone.' + key])


def test_load_from_and_resume_through_mmengine(runner_checkpoint, tmp_path):
    path, state = runner_checkpoint
    assert allow_mmengine_checkpoints()
    model = TinyClassifier(TINY)
    ckpt = load_checkpoint(model, path, map_location='cpu', strict=True)  # load_from
    assert ckpt['meta']['iter'] == 2
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    resumed = runner(tmp_path, 3, load_from=path, resume=True)  # its own MessageHub (conftest)
    resumed.train()  # resumes at iteration 2 (optimizer, message hub) and runs one more
    assert resumed.iter == 3
    losses, _ = resumed.message_hub.get_scalar('train/loss').data
    assert len(losses) == 3  # two restored from the checkpoint's message hub, one new


class WritesAFile:
    path = ''

    def __reduce__(self):
        return (open, (self.path, 'w'))


@pytest.mark.parametrize('via', ['ours', 'mmengine'])
def test_code_payload_is_refused_and_never_runs(tmp_path, via):
    target = tmp_path / 'written_by_unpickling'
    payload = WritesAFile()
    payload.path = str(target)
    path = str(tmp_path / 'evil.pth')
    torch.save({'state_dict': SwinTransformer(**TINY).state_dict(), 'extra': payload}, path)
    assert not target.exists()
    allow_mmengine_checkpoints()  # the allow-list must not open a door
    if via == 'ours':
        with pytest.raises(UnsafeCheckpointError, match='allow_pickle=True'):
            load_pretrained(SwinTransformer(**TINY), path)
    else:  # mmengine's own loader, replaced on import by ours on every torch
        with pytest.raises(Exception, match='io.open|Unsupported global') as err:
            load_checkpoint(SwinTransformer(**TINY), path, map_location='cpu')
        assert '\n' not in str(err.value) and 'TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1' in str(err.value)
    assert not target.exists()


def test_mmengine_loader_honours_torchs_opt_out(tmp_path, monkeypatch):
    """The opt-in for a trusted pickle through mmengine is torch's own variable: with it set,
    the payload runs (here: writes a file), as plain torch.load would."""
    target = tmp_path / 'written_by_unpickling'
    payload = WritesAFile()
    payload.path = str(target)
    path = str(tmp_path / 'trusted.pth')
    torch.save({'state_dict': SwinTransformer(**TINY).state_dict(), 'extra': payload}, path)
    monkeypatch.setenv('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', '1')
    ckpt = load_checkpoint(SwinTransformer(**TINY), path, map_location='cpu')
    assert target.exists() and 'extra' in ckpt


def test_restricted_getattr_resolves_only_history_buffer_statistics():
    import pickle

    from mmengine.logging import HistoryBuffer

    from swin_rpe_plugin.checkpoint.compat import history_buffer_getattr
    assert history_buffer_getattr(HistoryBuffer, 'mean') is HistoryBuffer.__dict__['mean']
    for obj, name in [(HistoryBuffer, '__init__'), (HistoryBuffer, '__class__'), (os, 'system'),
                      (HistoryBuffer, 'update'), (HistoryBuffer, '__getstate__')]:
        with pytest.raises(pickle.UnpicklingError):
            history_buffer_getattr(obj, name)


# Bad input: one clear error each.

def saved(tmp_path, state, name='ckpt.pth'):
    path = str(tmp_path / name)
    torch.save({'state_dict': state}, path)
    return path


def test_unknown_layout(tmp_path):
    path = saved(tmp_path, {'fc.weight': torch.zeros(2, 2)})
    with pytest.raises(KeyError, match="unrecognised Swin checkpoint layout.*fc.weight"):
        load_pretrained(SwinTransformer(**TINY), path)


def test_wrong_shape_names_key_and_both_shapes(tmp_path):
    state = SwinTransformer(**TINY).state_dict()
    state['stages.0.blocks.0.attn.w_msa.qkv.weight'] = torch.zeros(40, 16)
    with pytest.raises(ValueError, match=r'stages\.0\.blocks\.0\.attn\.w_msa\.qkv\.weight.*'
                                         r'\(40, 16\).*\(48, 16\)'):
        load_pretrained(SwinTransformer(**TINY), saved(tmp_path, state))


@pytest.mark.parametrize('suffix', ['.pth', '.safetensors'])
def test_truncated_file(tmp_path, suffix):
    from safetensors.torch import save_file
    state = SwinTransformer(**TINY).state_dict()
    path = str(tmp_path / f'full{suffix}')
    if suffix == '.pth':
        torch.save({'state_dict': state}, path)
    else:
        save_file({k: v.contiguous() for k, v in state.items()}, path)
    data = open(path, 'rb').read()
    cut = str(tmp_path / f'cut{suffix}')
    with open(cut, 'wb') as f:
        f.write(data[:len(data) // 2])
    with pytest.raises(ValueError, match='truncated or corrupt'):
        load_pretrained(SwinTransformer(**TINY), cut)


@pytest.mark.parametrize('bad', [float('nan'), float('inf')])
def test_nan_or_inf_values(tmp_path, bad):
    state = SwinTransformer(**TINY).state_dict()
    state['stages.1.blocks.0.norm1.weight'][3] = bad
    with pytest.raises(ValueError, match=r'stages\.1\.blocks\.0\.norm1\.weight: 1 NaN/Inf'):
        load_pretrained(SwinTransformer(**TINY), saved(tmp_path, state))


def test_missing_parameter_is_an_error_unless_not_strict(tmp_path):
    state = SwinTransformer(**TINY).state_dict()
    del state['stages.1.blocks.0.ffn.layers.1.weight']
    path = saved(tmp_path, state)
    with pytest.raises(KeyError, match=r'stages\.1\.blocks\.0\.ffn\.layers\.1\.weight'):
        load_pretrained(SwinTransformer(**TINY), path)
    report = load_pretrained(SwinTransformer(**TINY), path, strict=False)
    assert report.missing == ['stages.1.blocks.0.ffn.layers.1.weight']


def test_missing_file_and_wrong_path_type(tmp_path):
    with pytest.raises(FileNotFoundError, match='nope.pth'):
        read_checkpoint(str(tmp_path / 'nope.pth'))
    with pytest.raises(TypeError, match='path must be a str'):
        read_checkpoint(3)
