"""The benchmark loop: one record per comparison, roof timed in the same rounds, flags, memory.

Real steps on tiny inputs; nothing here asserts a timing, only how records are built from them.
"""
import os
import platform
import subprocess
import sys

import pytest
import torch

from benchmarks import runner
from benchmarks.format import format_table, other_steps


def test_flags_name_a_roofline_above_one_and_a_busy_machine():
    ok = dict(roofline_fraction=0.5, load_avg=1.0)
    assert runner.record_flags(ok, threads=2) == []
    assert runner.record_flags(dict(ok, roofline_fraction=1.01), 2) == ['roofline>1']
    assert runner.record_flags(dict(ok, load_avg=4.7), 2) == ['busy(load 4.7>2)']
    assert runner.record_flags(dict(ok, load_avg=2.0), 2) == []  # at, not above
    assert runner.record_flags(dict(roofline_fraction=None, load_avg=0.0), 2) == []


def test_table_shows_baseline_candidate_other_steps_and_flags():
    records = [dict(kind='backbone', arch='tiny', shape=[64, 64], batch=1, mode='infer+compile',
                    dtype='fp32', baseline='mmdet_compiled', candidate='ours_compiled',
                    mmdet_compiled_ms=2.0, ours_compiled_ms=1.0, ours_ms=1.5,
                    ours_spread_ms=0.1, speedup=2.0, flags=['roofline>1']),
               dict(kind='backbone', arch='tiny', shape=[64, 64], batch=1, mode='train',
                    dtype='fp32', baseline='mmdet', candidate='ours', mmdet_ms=3.0, ours_ms=1.0,
                    speedup=3.0, flags=[])]
    assert other_steps(records[0]) == ['ours']
    lines = format_table(records).splitlines()
    header = [c.strip() for c in lines[0].split(' | ')]
    rows = [dict(zip(header, (c.strip() for c in line.split(' | ')))) for line in lines[2:]]
    assert rows[0]['baseline'] == 'mmdet_compiled' and rows[0]['baseline_ms'] == '2.00'
    assert rows[0]['ours_ms'] == '1.00' and rows[0]['others'] == 'ours 1.5'
    assert rows[0]['flags'] == 'roofline>1' and rows[1]['flags'] == '-'
    assert rows[1]['others'] == '-' and rows[1]['mem_ratio'] == '-'


def _sleep_ms(ms):
    import time

    def step(_x):
        time.sleep(ms / 1e3)
    return step


def test_one_record_from_a_described_comparison(monkeypatch):
    calls = []
    real = runner.time_interleaved

    def spy(fns, x, repeats, warmup=1, progress=None):
        calls.append(sorted(fns))
        return real(fns, x, repeats, warmup, progress)

    monkeypatch.setattr(runner, 'time_interleaved', spy)
    monkeypatch.setattr(os, 'getloadavg', lambda: (9.0, 9.0, 9.0))
    c = runner.Comparison(key=dict(kind='test', arch='none', mode='infer'),
                          steps={'slow': _sleep_ms(20), 'fast': _sleep_ms(2)}, x=None,
                          baseline='slow', candidate='fast', gflops=1.0,
                          checks=dict(max_abs_diff=0.5))
    record = runner.run_comparison(c, repeats=3, threads=2)
    # the roof runs in the same rounds as the steps: one call, roofs included
    assert calls == [['fast', 'roof_mkl', 'roof_onednn', 'slow']]
    assert record['kind'] == 'test' and record['max_abs_diff'] == 0.5
    assert record['speedup'] == record['slow_ms'] / record['fast_ms']
    assert record['slow_ms'] >= 20 and record['slow_spread_ms'] >= 0
    assert abs(record['roofline_fraction']
               - 1.0 / record['fast_ms'] * 1e3 / record['roof_gflops']) < 1e-12
    assert record['flags'][-1] == 'busy(load 9.0>2)'
    assert 'profile' not in record and 'mem_ratio' not in record


def test_memory_is_measured_in_a_child_that_rebuilds_the_step(monkeypatch):
    """A child whose step allocates 64 MB more than another's reports about 64 MB more."""
    here = os.path.dirname(os.path.abspath(__file__))
    monkeypatch.setenv('PYTHONPATH', here)  # the children import benchmark_test_steps
    small = runner.ChildStep('benchmark_test_steps:allocating_step', dict(mb=8))
    big = runner.ChildStep('benchmark_test_steps:allocating_step', dict(mb=72))
    c = runner.Comparison(key=dict(kind='test'), steps={'a': _sleep_ms(1), 'b': _sleep_ms(1)},
                          x=None, baseline='a', candidate='b',
                          memory={'a': small, 'b': big})
    record = runner.run_comparison(c, repeats=1, threads=1)
    assert 60 < record['b_peak_mb'] - record['a_peak_mb'] < 68
    assert record['mem_ratio'] == record['b_peak_mb'] / record['a_peak_mb']
    assert 'roofline_fraction' not in record  # no work counted, no roofline


def test_profile_names_the_operators_of_each_step():
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    c = runner.Comparison(key=dict(kind='test'),
                          steps={'mm': lambda _x: a @ b, 'add': lambda _x: a + b}, x=None,
                          baseline='mm', candidate='add')
    record = runner.run_comparison(c, repeats=1, threads=1, profile=True)
    assert record['profile']['mm'][0]['op'] == 'aten::mm'
    assert record['profile']['add'][0]['op'] == 'aten::add'
    assert all(0 < r['share'] <= 1 for r in record['profile']['mm'])


_FAULTS_OF_A_SECOND_TENSOR = '''
import resource, sys
import torch
from benchmarks.runner import keep_freed_memory

def faults_of_a_second_64mib_tensor():
    torch.empty(16 << 20).fill_(1.0)  # made, touched, freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.empty(16 << 20).fill_(1.0)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

default = faults_of_a_second_64mib_tensor()
print(keep_freed_memory(), default, faults_of_a_second_64mib_tensor(), sep='|')
'''


@pytest.mark.skipif(platform.system() != 'Linux' or platform.libc_ver()[0] != 'glibc',
                    reason='keep_freed_memory sets glibc malloc options; elsewhere it is a no-op')
def test_timing_process_reuses_freed_memory_without_page_faults():
    """By default glibc maps a 64 MiB tensor afresh each time (its pages faulted in again: 16,384
    of 4 KiB, or 32 where pages are 2 MiB); once keep_freed_memory() ran, a second tensor reuses
    the first one's pages. In a fresh process: the malloc options are process-wide."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, '-c', _FAULTS_OF_A_SECOND_TENSOR], cwd=root,
                         capture_output=True, text=True, check=True).stdout
    malloc, default, kept = out.strip().splitlines()[-1].split('|')
    assert malloc == runner.KEPT_MALLOC
    assert int(default) >= 32 and int(kept) * 8 < int(default)
