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


def test_finish_adds_what_the_builder_derives_from_the_timed_steps():
    seen = []

    def finish(record, repeats):
        seen.append(repeats)
        record['ratio'] = record['b_ms'] / record['a_ms']

    c = runner.Comparison(key=dict(kind='test'), steps={'a': _sleep_ms(4), 'b': _sleep_ms(1)},
                          x=None, baseline='a', candidate='b', finish=finish)
    record = runner.run_comparison(c, repeats=2, threads=2)
    # speedup is a_ms / b_ms: its inverse equals b_ms / a_ms up to one rounding of each division
    assert seen == [2] and record['ratio'] == pytest.approx(1 / record['speedup'], rel=1e-15)


def test_part_times_split_a_step_into_its_parts():
    from benchmarks.padding_aware import PARTS, PartTimes

    class Head(torch.nn.Module):
        def predict(self, x):
            return _sleep_ms(3)(x)

    class Detector(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone, self.neck = torch.nn.Identity(), torch.nn.Identity()
            self.rpn_head, self.roi_head = Head(), Head()

        def run(self, x):
            self.rpn_head.predict(self.neck(self.backbone(x)))
            self.roi_head.predict(x)
            _sleep_ms(2)(x)

    model = Detector()
    parts = PartTimes(model)
    step = parts.step(model.run)
    for _ in range(3):
        step(torch.zeros(1))
    assert len(parts.calls) == 3 and all(set(c) == set(PARTS) for c in parts.calls)
    medians = parts.medians(2)
    assert medians['rpn'] >= 3 and medians['roi'] >= 3 and medians['rest'] >= 2
    assert medians['backbone'] < 3 and medians['neck'] < 3


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
malloc = keep_freed_memory()
print(malloc, default, *(faults_of_a_second_64mib_tensor() for _ in range(3)), sep='|')
'''
GLIBC = platform.system() == 'Linux' and platform.libc_ver()[0] == 'glibc'


def faults_in_a_fresh_process(env):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, '-c', _FAULTS_OF_A_SECOND_TENSOR], cwd=root, env=env,
                         capture_output=True, text=True, check=True).stdout
    malloc, default, *kept = out.strip().splitlines()[-1].split('|')
    return malloc, int(default), [int(k) for k in kept]


@pytest.mark.skipif(not GLIBC,
                    reason='keep_freed_memory sets glibc malloc options; elsewhere it is a no-op')
def test_timing_process_reuses_freed_memory_without_page_faults():
    """By default glibc maps a 64 MiB tensor afresh each time (its pages faulted in again: 16,384
    of 4 KiB, or 32 where pages are 2 MiB); once keep_freed_memory() ran, in a process started
    as tools/benchmark.py restarts itself (glibc's per-thread cache off), every later tensor
    reuses the first one's pages. In a fresh process: the malloc options are process-wide."""
    malloc, default, kept = faults_in_a_fresh_process(runner.kept_memory_env())
    assert malloc == runner.KEPT_MALLOC
    assert default >= 32 and all(k * 8 < default for k in kept), (default, kept)


@pytest.mark.skipif(not GLIBC or runner._glibc() >= (2, 39),
                    reason='glibc 2.39 merges the slack of posix_memalign itself (bug 30723)')
def test_a_process_started_with_the_per_thread_cache_says_so():
    """Before glibc 2.39, with its per-thread cache on, the slack posix_memalign frees can keep a
    freed block apart from the heap's top, and a block of the same size then takes fresh pages:
    keep_freed_memory() says so in what it returns (recorded in the JSON); the tool restarts."""
    malloc, _, _ = faults_in_a_fresh_process(runner.default_malloc_env())
    assert malloc == runner.KEPT_MALLOC_TCACHE
    assert runner.restart_env()['GLIBC_TUNABLES'].split(':')[-1] == runner.NO_TCACHE


def test_environments_of_the_timing_process_and_of_the_memory_children():
    """The timing process gets NO_TCACHE beside any tunables already set; a memory child gets
    the allocator users run (NO_TCACHE taken out again, anything else left)."""
    env = dict(PATH='/bin', GLIBC_TUNABLES='glibc.malloc.arena_max=2')
    kept = runner.kept_memory_env(env)
    assert kept['GLIBC_TUNABLES'] == f'glibc.malloc.arena_max=2:{runner.NO_TCACHE}'
    assert runner.kept_memory_env(kept) == kept  # once only
    assert runner.default_malloc_env(kept) == env
    assert 'GLIBC_TUNABLES' not in runner.default_malloc_env(runner.kept_memory_env({}))


def test_a_record_carries_only_the_settings_that_change_what_it_measures():
    """Setup and test variables (SWIN_RPE_WHEEL_CACHE of tools/setup_env.sh) are left out of the
    recorded command; kernel, backend, instruction-set and malloc overrides are kept."""
    env = dict(SWIN_RPE_WHEEL_CACHE='/tmp/wheels', SWIN_RPE_FUZZ_CASES='9', HOME='/root',
               SWIN_RPE_LINEAR='mkl', MALLOC_MMAP_MAX_='0', DNNL_MAX_CPU_ISA='AVX2',
               GLIBC_TUNABLES=runner.NO_TCACHE)
    assert runner.measured_settings(env) == ['DNNL_MAX_CPU_ISA=AVX2', 'MALLOC_MMAP_MAX_=0',
                                             'SWIN_RPE_LINEAR=mkl']
    env['GLIBC_TUNABLES'] = f'glibc.malloc.arena_max=2:{runner.NO_TCACHE}'
    assert 'GLIBC_TUNABLES=glibc.malloc.arena_max=2' in runner.measured_settings(env)


def test_every_kernel_and_backend_override_is_a_measured_setting():
    """Each variable ops/dispatch.py reads to force a path or kernel is recorded with a run."""
    from swin_rpe_plugin.ops.dispatch import KERNELS
    overrides = {'SWIN_RPE_BACKEND'} | {f'SWIN_RPE_{kind.upper()}' for kind in KERNELS}
    assert overrides <= set(runner.MEASURED_SETTINGS)


def test_the_tool_records_no_setup_variable(monkeypatch):
    """tools/benchmark.py's JSON command, with the variable of issue 37 set (CI sets it)."""
    import importlib.util
    for setting in runner.measured_settings():
        monkeypatch.delenv(setting.partition('=')[0])
    monkeypatch.setenv('SWIN_RPE_WHEEL_CACHE', '/tmp/wheels')
    monkeypatch.setenv('SWIN_RPE_ATTENTION', 'flash')
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location(
        'benchmark_tool', os.path.join(root, 'tools', 'benchmark.py'))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.provenance(['--quick'])['command'] == \
        'SWIN_RPE_ATTENTION=flash tools/benchmark.py --quick'
