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


def step_fn(model: torch.nn.Module, mode: str):
    """A callable running one inference or one train step (forward + backward) on x."""
    if mode == 'infer':
        model.eval()

        def run(x):
            with torch.no_grad():
                return model(x)
    else:
        model.train()

        def run(x):
            outs = model(x)
            sum(o.float().mean() for o in outs).backward()
            for p in model.parameters():
                p.grad = None
            return outs
    return run


def max_abs_diff(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def time_interleaved(fns: Dict[str, callable], x: torch.Tensor, repeats: int,
                     warmup: int = 1, progress=None) -> Dict[str, float]:
    """Median milliseconds per call of each function, calls interleaved round-robin."""
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
    return {name: statistics.median(ts) for name, ts in times.items()}


def sgemm_gflops(n: int = 2048, repeats: int = 5) -> float:
    """This machine's fp32 matmul peak (GFLOP/s, 2 n^3 flops per n x n product).

    The best of MKL's sgemm (``torch.mm``) and oneDNN's matmul (``ops.linear``): on AMD CPUs
    MKL takes a slow path, and the faster library sets the roof.
    """
    from ..ops import linear
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float('inf')
    for fn in (lambda: torch.mm(a, b), lambda: linear(a, b)):
        fn()
        best = min(best, *(_timed(fn) for _ in range(repeats)))
    return 2 * n**3 / best / 1e9


ROOF_N = 1024  # the roof's product: n x n by n x n, 2 n^3 flops, ~10-40 ms on 2 cores


def roof_steps(n: int = ROOF_N) -> Dict[str, callable]:
    """One n x n product with MKL's sgemm and one with oneDNN's matmul, as timed functions.

    They run interleaved with the models (same rounds, same load), so the roof is the machine's
    throughput at the time of the measurement: a roof measured once on an idle moment next to
    models timed on a busy one gave roofline fractions above 1.
    """
    from ..ops import linear
    a, b = torch.randn(n, n), torch.randn(n, n)
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
                  threads: int, ours_kwargs: dict) -> float:
    """Run one step of one model in a fresh process; return its peak RSS increase in MB."""
    spec = json.dumps(dict(which=which, arch=arch, shape=list(shape), batch=batch, mode=mode,
                           threads=threads, ours_kwargs=ours_kwargs))
    out = subprocess.run([sys.executable, '-m', 'swin_rpe_plugin.analysis.benchmark', spec],
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _child_main(spec: str) -> None:
    spec = json.loads(spec)
    torch.set_num_threads(spec['threads'])
    model = build_model(spec['which'], spec['arch'], **spec['ours_kwargs'])
    run = step_fn(model, spec['mode'])
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
                   progress=None) -> dict:
    """One record of the benchmark table."""
    ours_kwargs = ours_kwargs or {}
    stock, ours = build_pair(arch, **ours_kwargs)
    x = torch.randn(batch, 3, *shape)
    stock.eval(), ours.eval()
    with torch.no_grad():
        diff = max_abs_diff(stock(x), ours(x))
    if compile_model:
        if mode == 'infer':  # constant weights: inductor prepacks them for oneDNN
            import torch._inductor.config as inductor_config
            inductor_config.freezing = True
        ours = torch.compile(ours)
    roofs = roof_steps()
    fns = {'mmdet': step_fn(stock, mode), 'ours': step_fn(ours, mode), **roofs}
    ms = time_interleaved(fns, x, repeats, progress=progress)
    roof = max(2 * ROOF_N**3 / ms[k] / 1e6 for k in roofs)  # GFLOP/s from median ms
    gflops = backbone_gflops(stock, shape, batch) * (3 if mode == 'train' else 1)
    record = dict(arch=arch, shape=list(shape), batch=batch,
                  mode=mode + ('+compile' if compile_model else ''), ours_ms=ms['ours'],
                  mmdet_ms=ms['mmdet'], speedup=ms['mmdet'] / ms['ours'], max_abs_diff=diff,
                  gflops=gflops, ours_gflops_per_s=gflops / ms['ours'] * 1e3,
                  roof_gflops=roof, roof_at_start_gflops=sgemm,
                  roofline_fraction=gflops / ms['ours'] * 1e3 / roof,
                  load_avg=os.getloadavg()[0], **ours_kwargs)
    record['flags'] = record_flags(record, threads)
    if measure_memory:
        peaks = {w: child_peak_mb(w, arch, shape, batch, mode, threads, ours_kwargs)
                 for w in ('mmdet', 'ours')}
        record.update(ours_peak_mb=peaks['ours'], mmdet_peak_mb=peaks['mmdet'],
                      mem_ratio=peaks['ours'] / peaks['mmdet'])
    return record


def format_table(records: List[dict]) -> str:
    cols = ['arch', 'shape', 'batch', 'mode', 'mmdet_ms', 'ours_ms', 'speedup', 'mmdet_peak_mb',
            'ours_peak_mb', 'mem_ratio', 'max_abs_diff', 'gflops', 'roofline_fraction', 'flags']
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
                v = f'{v:.2e}' if c == 'max_abs_diff' else f'{v:.2f}'
            row.append(str(v))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    lines = [' | '.join(v.rjust(w) for v, w in zip(r, widths)) for r in rows]
    lines.insert(1, '-+-'.join('-' * w for w in widths))
    return '\n'.join(lines)


if __name__ == '__main__':
    _child_main(sys.argv[1])
