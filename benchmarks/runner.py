"""The one benchmark loop: timing, memory and roofline of any comparison described as data.

A :class:`Comparison` names the steps to time on one input (mmdet's backbone and ours; transformers'
Swinv2Model and ours; an exported model in a runtime and eager; two whole detectors), which two the
speedup compares, the work of one candidate step and the checks (output diffs) its builder computed.
:func:`run_comparison` turns it into one JSON record:

- Timing interleaves every step and two n x n matmuls of the comparison's dtype (A, B, roof, A, B,
  roof, ...) after a warm-up round and reports medians and spreads. The roof runs in the same rounds
  as the models, so a busy moment slows both and the roofline fraction stays meaningful.
- Peak memory is measured in a fresh child process per step (:class:`ChildStep` says how to rebuild
  it there): the kernel's peak resident set size (VmHWM) is reset to the current size just before
  the measured call (``/proc/self/clear_refs``), and the peak minus the size before it is what the
  step added on top of weights, input and the interpreter.
- The timing process keeps freed memory for reuse (:func:`keep_freed_memory`, glibc's malloc), so no
  step pays the page faults of memory another step handed back; the memory children keep the
  default, the allocator users run (:func:`default_malloc_env`).
"""
import ctypes
import gc
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

__all__ = ['DTYPES', 'ROOF_N', 'ChildStep', 'Comparison', 'run_comparison', 'time_interleaved',
           'roof_steps', 'matmul_gflops', 'fast_low_precision', 'record_flags', 'machine_info',
           'profile_ops', 'child_peak_mb', 'keep_freed_memory', 'freed_blocks_merge',
           'kept_memory_env', 'restart_env', 'default_malloc_env', 'measured_settings',
           'KEPT_MALLOC', 'KEPT_MALLOC_TCACHE', 'MEASURED_SETTINGS', 'NO_TCACHE']

DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16, 'fp16': torch.float16}
ROOF_N = 1024  # the roof's product: n x n by n x n, 2 n^3 flops, ~10-40 ms on 2 cores


@dataclass
class ChildStep:
    """How a fresh process rebuilds one step for the memory measurement.

    ``factory`` is 'module:function'; called with ``kwargs`` (JSON-able) it returns (step, input)
    and the child measures the peak of ``step(input)``.
    """
    factory: str
    kwargs: Dict[str, Any]


@dataclass
class Comparison:
    """One record's worth of work for :func:`run_comparison`.

    Attributes:
        key: the fields that name the record (arch, shape, batch, mode, dtype; runtime and
            precision for runtime records); copied into it first.
        steps: name -> step(x); every one is timed.
        x: the input all steps take.
        baseline, candidate: the two step names of ``speedup = baseline_ms / candidate_ms``.
        gflops: work of one candidate step (forward GFLOPs, x3 for a train step) for the
            roofline; None where it is not counted.
        roof_dtype: the dtype whose matmul peak is the roof ('fp32', 'bf16').
        checks: numbers the builder computed (max_abs_diff, rel_err_vs_fp32, ...), copied in.
        memory: name -> ChildStep for the steps whose peak memory is measured (None: none).
        profile: the steps to profile when profiling is asked for (default: baseline, candidate).
        finish: called with the record and the number of timed rounds once the steps are timed,
            to add what the builder derives from them (None: nothing).
    """
    key: Dict[str, Any]
    steps: Dict[str, Callable[[Any], Any]]
    x: Any
    baseline: str
    candidate: str = 'ours'
    gflops: Optional[float] = None
    roof_dtype: str = 'fp32'
    checks: Dict[str, Any] = field(default_factory=dict)
    memory: Optional[Dict[str, ChildStep]] = None
    profile: Optional[Tuple[str, ...]] = None
    finish: Optional[Callable[[Dict[str, Any], int], None]] = None


KEPT_MALLOC = 'glibc, freed memory kept'  # what keep_freed_memory sets, in every JSON it timed
# keep_freed_memory in a process started with glibc's per-thread cache on, before glibc 2.39:
# freed memory is kept, but a freed block is not always reused (see keep_freed_memory).
KEPT_MALLOC_TCACHE = KEPT_MALLOC + ', tcache on'
# glibc's tunable that turns its per-thread cache of small chunks off; read when a process starts.
NO_TCACHE = 'glibc.malloc.tcache_count=0'
# Settings outside the command line that change what a run measures, recorded with its command:
# our backend and kernel overrides, the CPU libraries' instruction-set overrides, and glibc's
# malloc settings (every MALLOC_* variable; GLIBC_TUNABLES but for the harness's own NO_TCACHE).
# Nothing else: a setup variable (SWIN_RPE_WHEEL_CACHE) or a test's (SWIN_RPE_FUZZ_CASES) is not
# part of a measurement.
MEASURED_SETTINGS = ('SWIN_RPE_BACKEND', 'SWIN_RPE_LINEAR', 'SWIN_RPE_LINEAR_GELU',
                     'SWIN_RPE_ATTENTION', 'ATEN_CPU_CAPABILITY', 'DNNL_MAX_CPU_ISA',
                     'ONEDNN_MAX_CPU_ISA', 'MKL_ENABLE_INSTRUCTIONS', 'MKL_DEBUG_CPU_TYPE')


def measured_settings(environ: Optional[Dict[str, str]] = None) -> List[str]:
    """``NAME=value`` of each setting in ``environ`` (default: this process's) that changes what
    a run measures (:data:`MEASURED_SETTINGS`, ``MALLOC_*``, ``GLIBC_TUNABLES``), sorted."""
    environ = os.environ if environ is None else environ
    settings = []
    for name, value in sorted(environ.items()):
        if name == 'GLIBC_TUNABLES':
            value = _without_no_tcache(value)
        if value and (name in MEASURED_SETTINGS or name.startswith('MALLOC_')
                      or name == 'GLIBC_TUNABLES'):
            settings.append(f'{name}={value}')
    return settings


def _without_no_tcache(tunables: str) -> str:
    return ':'.join(t for t in tunables.split(':') if t and t != NO_TCACHE)


def _glibc() -> Optional[Tuple[int, int]]:
    """glibc's (major, minor), or None where the C library is not glibc."""
    if platform.system() != 'Linux':
        return None
    name, version = platform.libc_ver()
    if name != 'glibc':
        return None
    return tuple(int(part) for part in version.split('.')[:2])


def _started_without_tcache() -> bool:
    """Whether this process started with glibc's per-thread cache off (its environment at
    start, which is what glibc read: ``os.environ`` may have changed since)."""
    try:
        with open('/proc/self/environ', 'rb') as f:
            start = f.read().decode(errors='replace').split('\0')
    except OSError:
        return False
    values = [e.partition('=')[2] for e in start if e.startswith('GLIBC_TUNABLES=')]
    return bool(values) and NO_TCACHE in values[-1].split(':')


def freed_blocks_merge() -> bool:
    """Whether a freed block merges back into glibc's heap here (see keep_freed_memory)."""
    version = _glibc()
    return version is not None and (version >= (2, 39) or _started_without_tcache())


def kept_memory_env(environ: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """``environ`` (default: this process's) with glibc's per-thread cache off, for starting a
    process in which keep_freed_memory() keeps every freed block for reuse."""
    env = dict(os.environ if environ is None else environ)
    others = _without_no_tcache(env.get('GLIBC_TUNABLES', ''))
    env['GLIBC_TUNABLES'] = f'{others}:{NO_TCACHE}' if others else NO_TCACHE
    return env


def restart_env() -> Optional[Dict[str, str]]:
    """The environment to start this process again with, so that keep_freed_memory() reuses
    every freed block; None where no restart is needed (glibc 2.39 or later, the cache off
    already, or another C library)."""
    return None if _glibc() is None or freed_blocks_merge() else kept_memory_env()


def default_malloc_env(environ: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """``environ`` (default: this process's) without the harness's NO_TCACHE: what a memory child
    runs with, the allocator users run."""
    env = dict(os.environ if environ is None else environ)
    others = _without_no_tcache(env.pop('GLIBC_TUNABLES', ''))
    if others:
        env['GLIBC_TUNABLES'] = others
    return env


def keep_freed_memory() -> str:
    """Make glibc's malloc keep freed memory for reuse in this process: ``mallopt(M_MMAP_MAX,
    0)`` (every block from the heap, none mapped on its own) and ``M_TRIM_THRESHOLD`` at 2 GiB
    (the heap's free top stays). Returns :data:`KEPT_MALLOC`; :data:`KEPT_MALLOC_TCACHE` where a
    freed block need not be reused (below); 'default' where the C library is not glibc (nothing
    changed).

    Why: by default glibc maps each block of 32 MiB and more afresh and unmaps it when freed, so
    every such tensor pays its page faults again, and how many a step pays depends on what ran
    before it (the measurements: docs/backbone.md, docs/training.md).

    Reuse also needs glibc 2.39, or its per-thread cache off from the process's start
    (:func:`kept_memory_env`; ``tools/benchmark.py`` restarts itself so). torch allocates with
    ``posix_memalign``, which asks for the size plus the alignment and frees the slack it cuts
    off; before glibc 2.39 the slack goes to the per-thread cache, where it is never merged
    (glibc bug 30723). Between a freed block and the heap's free top it keeps the two apart, and
    the next block of the same size, which again asks for more than that block, takes fresh pages
    above it: whether a block was reused depended on the heap's alignment and the cache's fill
    (13 of 30 fresh processes on a Zen 3 with glibc 2.36 faulted a second 64 MiB tensor afresh;
    with the cache off, none of 30)."""
    if _glibc() is None:
        return 'default'
    libc = ctypes.CDLL(None)
    m_trim_threshold, m_mmap_max = -1, -4  # glibc's malloc.h
    kept = libc.mallopt(m_mmap_max, 0) == 1 and libc.mallopt(m_trim_threshold, 2**31 - 1) == 1
    if not kept:
        return 'default'
    return KEPT_MALLOC if freed_blocks_merge() else KEPT_MALLOC_TCACHE


def time_interleaved(fns: Dict[str, Callable], x, repeats: int, warmup: int = 1, progress=None):
    """Median milliseconds per call of each function, calls interleaved round-robin; and
    every timing (for the spread)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn(x)
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn(x)
            times[name].append((time.perf_counter() - t0) * 1e3)
        if progress is not None:
            progress.update(1)
    return {name: statistics.median(ts) for name, ts in times.items()}, times


def _matmuls(n: int, dtype: str) -> Dict[str, Callable[[], Any]]:
    """An n x n product in ``dtype`` by torch.mm (MKL's sgemm in fp32) and by oneDNN's matmul
    (``ops.linear``): on AMD CPUs MKL takes a slow path, and the faster library sets the roof."""
    from swin_rpe_plugin.ops import linear
    a, b = torch.randn(n, n, dtype=DTYPES[dtype]), torch.randn(n, n, dtype=DTYPES[dtype])
    return {'roof_mkl': lambda: torch.mm(a, b), 'roof_onednn': lambda: linear(a, b)}


def roof_steps(n: int = ROOF_N, dtype: str = 'fp32') -> Dict[str, Callable[[Any], Any]]:
    """The roof's products as steps (they ignore the input), timed with the models."""
    return {name: (lambda _x, fn=fn: fn()) for name, fn in _matmuls(n, dtype).items()}


def matmul_gflops(n: int = 2048, repeats: int = 5, dtype: str = 'fp32') -> float:
    """This machine's matmul peak in ``dtype`` now (GFLOP/s, 2 n^3 flops per n x n product)."""
    best = float('inf')
    for fn in _matmuls(n, dtype).values():
        fn()
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def fast_low_precision(dtype: str, fp32_gflops: float) -> Tuple[bool, float]:
    """(worth timing, peak GFLOP/s) for bf16/fp16: measured, not guessed from the CPU vendor.

    A dtype is worth a line when its matmul peak beats fp32's by 1.5x (native bf16 units such
    as AMX or avx512_bf16); where it is emulated it runs at or below fp32 speed.
    """
    # n = 1024, 2 repeats: where bf16 is emulated (~1-2 GFLOP/s on a Zen 3) the default product
    # would take minutes to say so.
    peak = matmul_gflops(n=1024, repeats=2, dtype=dtype)
    return peak >= 1.5 * fp32_gflops, peak


def record_flags(record: dict, threads: int) -> List[str]:
    """Why a record should not be trusted: a roofline above 1, or a busy machine."""
    flags = []
    if (record.get('roofline_fraction') or 0) > 1:
        flags.append('roofline>1')
    if record.get('load_avg', 0) > threads:
        flags.append(f'busy(load {record["load_avg"]:.1f}>{threads})')
    return flags


CPU_FEATURES = ('avx2', 'avx512f', 'avx512_bf16', 'amx_bf16')  # what the kernels' speed turns on


def machine_info(threads: int) -> dict:
    """CPU model (name, family/model, the vector features that matter), thread count and torch
    version, for every JSON record. A KVM guest's model name can be as bare as 'AMD EPYC'."""
    fields = {}
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if not line.strip():
                    break  # the first processor is enough
                key, _, value = line.partition(':')
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    flags = fields.get('flags', '').split()
    return dict(cpu=fields.get('model name', 'unknown'),
                cpu_family_model=f"{fields.get('cpu family', '?')}/{fields.get('model', '?')}",
                cpu_features=[f for f in CPU_FEATURES if f in flags],
                threads=threads, torch=torch.__version__)


def profile_ops(fn: Callable, x, top: int = 12) -> List[dict]:
    """The operators that take the time of one call of fn(x): self CPU time, share of the call.

    One warm-up call first; torch.profiler's per-operator self time (time inside an operator
    minus its children), so the shares add up to at most 1.
    """
    from torch.profiler import ProfilerActivity, profile
    fn(x)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(x)
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: -e.self_cpu_time_total)
    return [dict(op=e.key, share=e.self_cpu_time_total / total, calls=e.count,
                 ms=e.self_cpu_time_total / 1e3) for e in events[:top]]


def child_peak_mb(step: ChildStep, threads: int) -> float:
    """Run one step in a fresh process; return its peak RSS increase in MB."""
    spec = json.dumps(dict(factory=step.factory, kwargs=step.kwargs, threads=threads))
    # The child imports benchmarks/ and the package from the clone the parent runs (the repo
    # root: neither need be installed).
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = default_malloc_env()
    env['PYTHONPATH'] = os.pathsep.join(
        [root] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p])
    out = subprocess.run([sys.executable, '-m', __name__, spec], capture_output=True, text=True,
                         env=env)
    if out.returncode:
        raise RuntimeError(f'memory run of {step.factory} failed: '
                           f'{out.stderr.strip().splitlines()[-1:]}')
    return float(out.stdout.strip().splitlines()[-1])


def run_comparison(c: Comparison, repeats: int, threads: int, progress=None,
                   profile: bool = False, measure_memory: bool = True) -> dict:
    """The record of one comparison: key, medians and spreads of every step, speedup, checks,
    roofline against the matmul peak of its dtype timed in the same rounds, flags, memory."""
    roofs = roof_steps(dtype=c.roof_dtype)
    ms, all_ms = time_interleaved({**c.steps, **roofs}, c.x, repeats, progress=progress)
    roof = max(2 * ROOF_N**3 / ms[k] / 1e6 for k in roofs)  # GFLOP/s from median ms
    record = dict(c.key)
    for name in c.steps:
        record[f'{name}_ms'] = ms[name]
        record[f'{name}_spread_ms'] = max(all_ms[name]) - min(all_ms[name])
    record.update(baseline=c.baseline, candidate=c.candidate,
                  speedup=ms[c.baseline] / ms[c.candidate], **c.checks)
    record.update(gflops=c.gflops, roof_gflops=roof, roof_dtype=c.roof_dtype,
                  load_avg=os.getloadavg()[0])
    if c.gflops is not None:
        achieved = c.gflops / ms[c.candidate] * 1e3
        record.update(ours_gflops_per_s=achieved, roofline_fraction=achieved / roof)
    record['flags'] = record_flags(record, threads)
    if c.finish is not None:
        c.finish(record, repeats)
    if profile:
        names = c.profile or (c.candidate, c.baseline)
        record['profile'] = {name: profile_ops(c.steps[name], c.x) for name in names}
    if measure_memory and c.memory:
        for name, step in c.memory.items():
            record[f'{name}_peak_mb'] = child_peak_mb(step, threads)
        if c.baseline in c.memory and c.candidate in c.memory:
            record['mem_ratio'] = (record[f'{c.candidate}_peak_mb']
                                   / record[f'{c.baseline}_peak_mb'])
    return record


def _status_mb(name: str) -> float:
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(name + ':'):
                return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f'{name} not in /proc/self/status')


def _child_main(spec: str) -> None:
    spec = json.loads(spec)
    torch.set_num_threads(spec['threads'])
    module, function = spec['factory'].split(':')
    step, x = getattr(importlib.import_module(module), function)(**spec['kwargs'])
    gc.collect()
    before = _status_mb('VmRSS')
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')  # reset VmHWM (peak RSS) to the current RSS
    step(x)
    print(_status_mb('VmHWM') - before)


if __name__ == '__main__':
    _child_main(sys.argv[1])
