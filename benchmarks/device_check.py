"""Parity and speed of our backbone against mmdet's on an accelerator, same weights.

What ``tools/device_check.py`` runs on a CUDA machine (the code is device-neutral, and the tests
run it on CPU): our backbone takes the generic path there (``ops/dispatch.py``), so this is the
check that the path no CPU test can time is right and fast where it matters.
"""
import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .backbone import DTYPES, build_pair, max_abs_diff, max_rel_err, step_fn


def _synchronize(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def _grads(model: torch.nn.Module, x: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Gradients of a loss with fixed random weights per output (the mean square of normed
    outputs would be constant, its gradients rounding noise)."""
    model.train()
    model.zero_grad()
    outs = model(x)
    generator = torch.Generator(device=x.device).manual_seed(0)
    sum((o.float() * torch.randn(o.shape, generator=generator, device=x.device)).sum()
        for o in outs).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def parity(device: str, arch: str = 'tiny', shape: Tuple[int, int] = (97, 131),
           batch: int = 2, dtypes: Sequence[str] = ('bf16', 'fp16')) -> List[dict]:
    """Records: fp32 outputs and gradients against mmdet's; each autocast dtype against our
    float32 (and mmdet's own error under the same autocast, for scale)."""
    device = torch.device(device)
    stock, ours = (m.to(device) for m in build_pair(arch))
    x = torch.randn(batch, 3, *shape, device=device)
    ref_stock, ref_ours = step_fn(stock, 'infer')(x), step_fn(ours, 'infer')(x)
    g_stock, g_ours = _grads(stock, x), _grads(ours, x)
    records = [dict(check='fp32 outputs vs mmdet',
                    max_abs_diff=max_abs_diff(ref_ours, ref_stock)),
               dict(check='fp32 gradients vs mmdet',
                    rel_err=max(max_rel_err([g_ours[n]], [g_stock[n]]) for n in g_ours),
                    worst=max(g_ours, key=lambda n: max_rel_err([g_ours[n]], [g_stock[n]])))]
    for dtype in dtypes:
        outs = step_fn(ours, 'infer', dtype)(x)
        stock_outs = step_fn(stock, 'infer', dtype)(x)
        records.append(dict(check=f'{dtype} autocast vs our fp32',
                            finite=all(bool(torch.isfinite(o).all()) for o in outs),
                            rel_err=max_rel_err(outs, ref_ours),
                            mmdet_rel_err=max_rel_err(stock_outs, ref_stock)))
    return records


def _launches(fn, x: torch.Tensor) -> Optional[int]:
    """Kernels (and device copies) one step launches on a CUDA device, by the profiler;
    None elsewhere."""
    if x.device.type != 'cuda':
        return None
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(x)
        _synchronize(x.device)
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def _aten_kernels(model: torch.nn.Module, mode: str, dtype: str, x: torch.Tensor) -> int:
    """The device-independent count of ``benchmarks/work.py`` (aten operators that launch
    work), on the meta device: what the same step dispatches on any device."""
    import copy

    from .work import count_kernels
    meta = copy.deepcopy(model).to('meta')
    return count_kernels(step_fn(meta, mode, dtype), torch.empty(x.shape, device='meta'))[0]


def speed(device: str, cases: Sequence[Tuple[Tuple[int, int], int]], modes: Sequence[str],
          dtypes: Sequence[str], arch: str = 'tiny', repeats: int = 10,
          compiled: bool = False) -> List[dict]:
    """Median ms per step of ours and mmdet's, interleaved, peak device memory and kernels
    launched per step (CUDA), and the aten operators dispatched per step (any device).
    ``compiled``: both models under ``torch.compile`` (mode '<mode>+compile')."""
    device = torch.device(device)
    stock, ours = (m.to(device) for m in build_pair(arch))
    models = {'mmdet': stock, 'ours': ours}
    if compiled:
        models = {name: torch.compile(m) for name, m in models.items()}
    records = []
    for (shape, batch) in cases:
        x = torch.randn(batch, 3, *shape, device=device)
        for mode in modes:
            for dtype in dtypes:
                record = dict(arch=arch, shape=list(shape), batch=batch,
                              mode=mode + ('+compile' if compiled else ''), dtype=dtype)
                times = {'mmdet': [], 'ours': []}
                fns = {name: step_fn(m, mode, dtype) for name, m in models.items()}
                for name, fn in fns.items():  # warm-up (kernel selection, caches, compiling)
                    fn(x), fn(x)
                for _ in range(repeats):
                    for name, fn in fns.items():
                        _synchronize(device)
                        t0 = time.perf_counter()
                        fn(x)
                        _synchronize(device)
                        times[name].append((time.perf_counter() - t0) * 1e3)
                for name in fns:
                    record[f'{name}_ms'] = sorted(times[name])[len(times[name]) // 2]
                record['speedup'] = record['mmdet_ms'] / record['ours_ms']
                if device.type == 'cuda':
                    for name, fn in fns.items():
                        torch.cuda.empty_cache()
                        torch.cuda.reset_peak_memory_stats(device)
                        base = torch.cuda.memory_allocated(device)
                        fn(x)
                        record[f'{name}_peak_mb'] = (torch.cuda.max_memory_allocated(device)
                                                     - base) / 2**20
                        record[f'{name}_launches'] = _launches(fn, x)
                    record['mem_ratio'] = record['ours_peak_mb'] / record['mmdet_peak_mb']
                if not compiled and dtype == 'fp32':  # meta has no autocast
                    for name in ('mmdet', 'ours'):
                        record[f'{name}_aten_kernels'] = _aten_kernels(
                            {'mmdet': stock, 'ours': ours}[name], mode, dtype, x)
                records.append(record)
    return records


def supported_dtypes(device: str) -> List[str]:
    """fp32, plus bf16 where the device has it, plus fp16 on CUDA."""
    names = ['fp32']
    if device.startswith('cuda'):
        if torch.cuda.is_bf16_supported():
            names.append('bf16')
        names.append('fp16')
    else:
        names.append('bf16')
    return [n for n in names if n in DTYPES]
