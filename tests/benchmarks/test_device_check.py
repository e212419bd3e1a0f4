"""tools/device_check.py: the skip line without CUDA, and its checks run on CPU through the
generic path (the one CUDA takes)."""
import torch

from benchmarks.device_check import parity, speed, supported_dtypes
from swin_rpe_plugin.ops.dispatch import force_backend


def test_without_cuda_it_prints_one_skip_line(monkeypatch, capsys):
    import importlib.util
    import os
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location('device_check',
                                                  os.path.join(root, 'tools/device_check.py'))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    assert tool.main([]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith('device_check: skipped: no CUDA device')


def test_parity_records_on_the_generic_path():
    with force_backend('generic'):
        records = parity('cpu', shape=(61, 93), batch=2, dtypes=['bf16'])
    by_check = {r['check']: r for r in records}
    assert by_check['fp32 outputs vs mmdet']['max_abs_diff'] < 1e-4
    assert by_check['fp32 gradients vs mmdet']['rel_err'] < 1e-4
    low = by_check['bf16 autocast vs our fp32']
    assert low['finite'] and low['rel_err'] < 0.05


def test_speed_records_have_both_models():
    with force_backend('generic'):
        records = speed('cpu', [((64, 96), 1)], ['infer', 'train'], ['fp32'], repeats=1)
    assert [(r['mode'], r['dtype']) for r in records] == [('infer', 'fp32'), ('train', 'fp32')]
    for r in records:
        assert r['ours_ms'] > 0 and r['mmdet_ms'] > 0
        assert abs(r['speedup'] - r['mmdet_ms'] / r['ours_ms']) < 1e-9
    assert supported_dtypes('cpu') == ['fp32', 'bf16']
