"""tools/benchmark.py --arch v2-*: one skip line where transformers is not importable (CI).

Its timing and parity need transformers and run from the tool (see docs/swinv2.md); the parity
itself is tested against the committed fixtures (tests/models/test_swin_v2.py)."""
import importlib.util
import os

from swin_rpe_plugin.analysis import benchmark_v2
from conftest import ROOT


def load_tool():
    spec = importlib.util.spec_from_file_location(
        'benchmark_tool', os.path.join(ROOT, 'tools', 'benchmark.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_v2_benchmark_prints_one_skip_line_without_transformers(monkeypatch, capsys):
    monkeypatch.setattr(benchmark_v2, 'transformers_available', lambda: False)
    assert load_tool().main(['--arch', 'v2-tiny']) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('skip: transformers is not importable')


def test_v2_line_format():
    line = benchmark_v2.format_v2_line(dict(
        arch='v2-tiny', shape=[512, 512], batch=2, mode='infer', window=8, ours_ms=100.0,
        transformers_ms=160.0, speedup=1.6, max_abs_diff=1e-5, threads=2))
    assert line.startswith('v2-tiny 512x512 b2 w8 infer') and 'speedup 1.60x' in line
    assert 'parity 1.0e-05' in line

