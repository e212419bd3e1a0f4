"""Benchmark runner: our backbone against mmdet 3.3's SwinTransformer, same config and weights.

Timing interleaves the two models (A, B, A, B, ...) after warm-up in one process and reports
medians. Peak memory is measured in a fresh child process per (model, mode, shape, batch) that
builds only that model: the kernel's peak resident set size (VmHWM) is reset to the current
size just before the measured step (``/proc/self/clear_refs``), and the peak minus the size
before the step is what the step itself added on top of weights, input and the interpreter.
"""
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch

DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16, 'fp16': torch.float16}

ARCHS = {
    'tiny': dict(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)),
    'small': dict(embed_dims=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24)),
    'base': dict(embed_dims=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32)),
}


def build_model(which: str, arch: str, window_size: int = 7, seed: int = 0, **ours_kwargs):
    """mmdet's Swin ('mmdet') or ours ('ours') with the same seeded random weights."""
    from mmdet.models.backbones import SwinTransformer as MMDetSwin

    from ..models import SwinTransformer
    cfg = dict(ARCHS[arch], window_size=window_size, drop_path_rate=0.0)
    torch.manual_seed(seed)
    model = MMDetSwin(**cfg) if which == 'mmdet' else SwinTransformer(**cfg, **ours_kwargs)
    model.init_weights()
    torch.manual_seed(seed + 1)
    with torch.no_grad():  # mmdet leaves bias tables at zero; give them values
        for name, p in model.named_parameters():
            if 'relative_position_bias_table' in name:
                p.normal_(0, 0.5)
    return model


def build_pair(arch: str, window_size: int = 7, seed: int = 0, **ours_kwargs):
    """mmdet's Swin with random weights (tables included) and ours loaded from its state dict."""
    stock = build_model('mmdet', arch, window_size, seed)
    ours = build_model('ours', arch, window_size, seed, **ours_kwargs)
    ours.load_state_dict(stock.state_dict(), strict=True)
    return stock, ours


def step_fn(model: torch.nn.Module, mode: str, dtype: str = 'fp32'):
    """A callable running one inference or one train step (forward + backward) on x.

    dtype 'bf16'/'fp16' runs the forward under ``torch.autocast`` of that dtype (weights stay
    float32, as in mixed-precision training); 'fp32' runs without autocast.
    """
    def autocast(x):
        return torch.autocast(x.device.type, dtype=DTYPES[dtype], enabled=dtype != 'fp32')

    if mode == 'infer':
        model.eval()

        def run(x):
            with torch.no_grad(), autocast(x):
                return model(x)
    else:
        model.train()

        def run(x):
            with autocast(x):
                outs = model(x)
            sum(o.float().mean() for o in outs).backward()
            for p in model.parameters():
                p.grad = None
            return outs
    return run


def max_abs_diff(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))


def max_rel_err(a: Sequence[torch.Tensor], ref: Sequence[torch.Tensor]) -> float:
    """Largest, over the outputs, of max |a - ref| / max |ref|."""
    return max(((x.float() - y.float()).abs().max() / y.float().abs().max()).item()
               for x, y in zip(a, ref))


def time_interleaved(fns: Dict[str, callable], x: torch.Tensor, repeats: int,
                     warmup: int = 1, progress=None):
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


def sgemm_gflops(n: int = 2048, repeats: int = 5, dtype: str = 'fp32') -> float:
    """This machine's matmul peak in ``dtype`` (GFLOP/s, 2 n^3 flops per n x n product).

    The best of ``torch.mm`` (MKL's sgemm in fp32) and oneDNN's matmul (``ops.linear``): on AMD
    CPUs MKL takes a slow path, and the faster library sets the roof.
    """
    from ..ops import linear
    a, b = torch.randn(n, n, dtype=DTYPES[dtype]), torch.randn(n, n, dtype=DTYPES[dtype])
    best = float('inf')
    for fn in (lambda: torch.mm(a, b), lambda: linear(a, b)):
        fn()
        best = min(best, *(_timed(fn) for _ in range(repeats)))
    return 2 * n**3 / best / 1e9


ROOF_N = 1024  # the roof's product: n x n by n x n, 2 n^3 flops, ~10-40 ms on 2 cores


def roof_steps(n: int = ROOF_N, dtype: str = 'fp32') -> Dict[str, callable]:
    """One n x n product in ``dtype`` with torch.mm (MKL's sgemm in fp32) and one with oneDNN's
    matmul, as timed functions.

    They run interleaved with the models (same rounds, same load), so the roof is the machine's
    throughput at the time of the measurement: a roof measured once on an idle moment next to
    models timed on a busy one gave roofline fractions above 1.
    """
    from ..ops import linear
    a, b = torch.randn(n, n, dtype=DTYPES[dtype]), torch.randn(n, n, dtype=DTYPES[dtype])
    return {'roof_mkl': lambda _x: torch.mm(a, b), 'roof_onednn': lambda _x: linear(a, b)}


def record_flags(record: dict, threads: int) -> List[str]:
    """Why a record should not be trusted: a roofline above 1, or a busy machine."""
    flags = []
    if record.get('roofline_fraction', 0) > 1:
        flags.append('roofline>1')
    if record.get('load_avg', 0) > threads:
        flags.append(f'busy(load {record["load_avg"]:.1f}>{threads})')
    return flags


def backbone_gflops(model: torch.nn.Module, shape: Tuple[int, int], batch: int) -> float:
    """Forward GFLOPs (2 x multiply-adds counted by mmengine's FlopAnalyzer on the model)."""
    from mmengine.analysis import FlopAnalyzer
    model.eval()
    x = torch.randn(batch, 3, *shape)
    with torch.no_grad():
        analyzer = FlopAnalyzer(model, (x, ))
        analyzer.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
        return 2 * analyzer.total() / 1e9


def profile_ops(fn, x: torch.Tensor, top: int = 12) -> List[dict]:
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


def format_profile(record: dict) -> str:
    """Side-by-side top operators of ours and mmdet's for one record."""
    head = (f"{record['arch']} {'x'.join(map(str, record['shape']))} b{record['batch']} "
            f"{record['mode']} {record['dtype']}")
    lines = [head, f"{'ours':<48} share   | {'mmdet':<48} share"]
    ours, stock = record['profile']['ours'], record['profile']['mmdet']
    for i in range(max(len(ours), len(stock))):
        cells = []
        for rows in (ours, stock):
            cells.append(f"{rows[i]['op'][:48]:<48} {rows[i]['share']:5.1%}" if i < len(rows)
                         else ' ' * 54)
        lines.append('   | '.join(cells))
    return '\n'.join(lines)


def machine_info(threads: int) -> dict:
    """CPU model, thread count and torch version, for every JSON record."""
    cpu = 'unknown'
    try:
        with open('/proc/cpuinfo') as f:
            cpu = next((line.split(':', 1)[1].strip() for line in f
                        if line.startswith('model name')), cpu)
    except OSError:
        pass
    return dict(cpu=cpu, threads=threads, torch=torch.__version__)


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _status_mb(field: str) -> float:
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f'{field} not in /proc/self/status')


def child_peak_mb(which: str, arch: str, shape: Tuple[int, int], batch: int, mode: str,
                  threads: int, ours_kwargs: dict, dtype: str = 'fp32') -> float:
    """Run one step of one model in a fresh process; return its peak RSS increase in MB."""
    spec = json.dumps(dict(which=which, arch=arch, shape=list(shape), batch=batch, mode=mode,
                           threads=threads, ours_kwargs=ours_kwargs, dtype=dtype))
    out = subprocess.run([sys.executable, '-m', 'swin_rpe_plugin.analysis.benchmark', spec],
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def fast_low_precision(dtype: str, fp32_gflops: float) -> Tuple[bool, float]:
    """(worth timing, peak GFLOP/s) for bf16/fp16: measured, not guessed from the CPU vendor.

    A dtype is worth a line when its matmul peak beats fp32's by 1.5x (native bf16 units such
    as AMX); where it is emulated it runs at or below fp32 speed and the line would only say so.
    """
    peak = sgemm_gflops(dtype=dtype)
    return peak >= 1.5 * fp32_gflops, peak


def _child_main(spec: str) -> None:
    spec = json.loads(spec)
    torch.set_num_threads(spec['threads'])
    model = build_model(spec['which'], spec['arch'], **spec['ours_kwargs'])
    run = step_fn(model, spec['mode'], spec.get('dtype', 'fp32'))
    x = torch.randn(spec['batch'], 3, *spec['shape'])
    gc.collect()
    before = _status_mb('VmRSS')
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')  # reset VmHWM (peak RSS) to the current RSS
    run(x)
    print(_status_mb('VmHWM') - before)


def benchmark_case(arch: str, shape: Tuple[int, int], batch: int, mode: str, repeats: int,
                   threads: int, sgemm: float, measure_memory: bool = True,
                   compile_model: bool = False, ours_kwargs: Optional[dict] = None,
                   progress=None, dtype: str = 'fp32', profile: bool = False) -> dict:
    """One record of the benchmark table; ``sgemm`` is the matmul peak of ``dtype``.

    max_abs_diff compares ours with mmdet under the same autocast; rel_err_vs_fp32 compares
    ours in ``dtype`` with ours in float32 (max |diff| / max |fp32 output|, worst output).
    """
    ours_kwargs = ours_kwargs or {}
    stock, ours = build_pair(arch, **ours_kwargs)
    x = torch.randn(batch, 3, *shape)
    stock.eval(), ours.eval()
    reference = step_fn(ours, 'infer')(x)
    outs = step_fn(ours, 'infer', dtype)(x)
    diff = max_abs_diff(step_fn(stock, 'infer', dtype)(x), outs)
    rel_err = max_rel_err(outs, reference)
    if compile_model:
        if mode == 'infer':  # constant weights: inductor prepacks them for oneDNN
            import torch._inductor.config as inductor_config
            inductor_config.freezing = True
        ours = torch.compile(ours)
    roofs = roof_steps(dtype=dtype)
    fns = {'mmdet': step_fn(stock, mode, dtype), 'ours': step_fn(ours, mode, dtype)}
    ms, all_ms = time_interleaved({**fns, **roofs}, x, repeats, progress=progress)
    roof = max(2 * ROOF_N**3 / ms[k] / 1e6 for k in roofs)  # GFLOP/s from median ms
    gflops = backbone_gflops(stock, shape, batch) * (3 if mode == 'train' else 1)
    record = dict(arch=arch, shape=list(shape), batch=batch,
                  mode=mode + ('+compile' if compile_model else ''), dtype=dtype,
                  ours_ms=ms['ours'], mmdet_ms=ms['mmdet'], speedup=ms['mmdet'] / ms['ours'],
                  ours_spread_ms=max(all_ms['ours']) - min(all_ms['ours']),
                  mmdet_spread_ms=max(all_ms['mmdet']) - min(all_ms['mmdet']),
                  max_abs_diff=diff, rel_err_vs_fp32=rel_err,
                  gflops=gflops, ours_gflops_per_s=gflops / ms['ours'] * 1e3,
                  roof_gflops=roof, roof_at_start_gflops=sgemm,
                  roofline_fraction=gflops / ms['ours'] * 1e3 / roof,
                  load_avg=os.getloadavg()[0], **ours_kwargs)
    record['flags'] = record_flags(record, threads)
    if profile:
        record['profile'] = {name: profile_ops(fn, x) for name, fn in fns.items()}
    if measure_memory:
        peaks = {w: child_peak_mb(w, arch, shape, batch, mode, threads, ours_kwargs, dtype)
                 for w in ('mmdet', 'ours')}
        record.update(ours_peak_mb=peaks['ours'], mmdet_peak_mb=peaks['mmdet'],
                      mem_ratio=peaks['ours'] / peaks['mmdet'])
    return record


def format_table(records: List[dict]) -> str:
    cols = ['arch', 'shape', 'batch', 'mode', 'dtype', 'mmdet_ms', 'ours_ms', 'speedup',
            'mmdet_peak_mb', 'ours_peak_mb', 'mem_ratio', 'max_abs_diff', 'rel_err_vs_fp32',
            'gflops', 'roofline_fraction', 'flags']
    rows = [cols]
    for r in records:
        row = []
        for c in cols:
            v = r.get(c, '-')
            if c == 'shape':
                v = 'x'.join(map(str, v))
            elif c == 'flags':
                v = ' '.join(v) if isinstance(v, list) and v else '-'
            elif isinstance(v, float):
                v = f'{v:.2e}' if c in ('max_abs_diff', 'rel_err_vs_fp32') else f'{v:.2f}'
            row.append(str(v))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    lines = [' | '.join(v.rjust(w) for v, w in zip(r, widths)) for r in rows]
    lines.insert(1, '-+-'.join('-' * w for w in widths))
    return '\n'.join(lines)


if __name__ == '__main__':
    _child_main(sys.argv[1])
