"""Host work of one step, ours against mmdet's Swin: what a GPU's host pays, measured on a CPU.

At detection sizes a GPU step is bound by its host (mmdet's Swin-T at 800x1216 b2 fp16 on an
H200: 45 ms a train step for 25 ms of kernels): Python calls, the dispatcher, autograd's
bookkeeping and the launches. Those depend on the code, not on the device, the width or the
image size. So both backbones run here with Swin-T's depth (2, 2, 6, 2) at 16 channels on 64x64
images (:data:`HOST_ARCH`), where the arithmetic vanishes, on the generic path
(``SWIN_RPE_BACKEND=generic``, what a GPU runs), with the same weights:

- :func:`count_python_calls`: Python function calls and calls of C functions from Python
  (``sys.setprofile``'s 'call' and 'c_call' events, generator resumptions included), forward
  and backward (on the CPU autograd runs a Function's Python backward in the calling thread).
  Exact and repeatable.
- :func:`count_top_level_ops`: ATen operators dispatched from outside any other ATen operator
  (the profiler's ``aten::`` events with no ``aten::`` ancestor): what Python code and autograd
  nodes call, no-op casts, views and detaches included, each one a trip through the dispatcher.
  Exact and repeatable.
- :func:`thread_times`: CPU time of the calling thread per step (``time.thread_time``), one
  thread, interleaved medians: the proxy of a GPU host's step time.

With ``freeze_tables`` the relative position tables take no gradient in either model: the
CPU's SDPA then runs its fused kernels forward and backward, as a GPU's does whether or not the
bias takes a gradient (CPU SDPA falls back to its math path, ~13 ops a call, for a bias that
needs one; no GPU pays that). The counts and times of the train records are taken that way;
:func:`host_record` gives the unfrozen Python count beside them.
"""
import contextlib
import statistics
import sys
import time
from collections import Counter
from typing import Callable, Dict, Optional, Tuple

import torch

from .runner import DTYPES

__all__ = ['HOST_ARCH', 'HOST_SHAPE', 'build_host_pair', 'count_python_calls',
           'count_top_level_ops', 'thread_times', 'host_step', 'host_steps', 'host_record',
           'detector_host_record']

# Swin-T's depth and head layout at 16 channels: the host's work per step is that of Swin-T.
HOST_ARCH = dict(embed_dims=16, depths=(2, 2, 6, 2), num_heads=(1, 2, 4, 8))
HOST_SHAPE = (64, 64)


def build_host_pair(drop_path_rate: float = 0.2, freeze_tables: bool = True, seed: int = 0,
                    arch: Optional[dict] = None):
    """(mmdet's Swin, ours) of ``arch`` (default :data:`HOST_ARCH`), ours loaded from mmdet's
    state dict (tables drawn from N(0, 0.5)), drop path as mmdet's Swin-T detection configs."""
    from mmdet.models.backbones import SwinTransformer as MMDetSwin

    from swin_rpe_plugin.models import SwinTransformer
    cfg = dict(arch or HOST_ARCH, window_size=7, drop_path_rate=drop_path_rate)
    torch.manual_seed(seed)
    stock = MMDetSwin(**cfg)
    stock.init_weights()
    with torch.no_grad():
        for name, p in stock.named_parameters():
            if 'relative_position_bias_table' in name:
                p.normal_(0, 0.5)
    ours = SwinTransformer(**cfg)
    ours.load_state_dict(stock.state_dict(), strict=True)
    for model in (stock, ours):
        for name, p in model.named_parameters():
            if 'relative_position_bias_table' in name:
                p.requires_grad_(not freeze_tables)
    return stock, ours


def count_python_calls(step: Callable, x: torch.Tensor) -> int:
    """Python calls of ``step(x)``: function calls and C calls made from Python."""
    calls = [0]

    def profile(frame, event, arg):
        if event == 'call' or event == 'c_call':
            calls[0] += 1

    getattr(step, 'reset', _nothing)()
    sys.setprofile(profile)
    try:
        step(x)
    finally:
        sys.setprofile(None)
    return calls[0] - 1  # the profiler's own sys.setprofile(None)


def count_top_level_ops(step: Callable, x: torch.Tensor) -> Counter:
    """ATen operators of ``step(x)`` dispatched outside any other ATen operator, by name."""
    getattr(step, 'reset', _nothing)()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step(x)
    counts = Counter()
    for event in prof.events():
        if not event.name.startswith('aten::'):
            continue
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith('aten::'):
            parent = parent.cpu_parent
        if parent is None:
            counts[event.name] += 1
    return counts


def thread_times(steps: Dict[str, Callable], x: torch.Tensor, repeats: int = 30,
                 warmup: int = 3) -> Dict[str, float]:
    """Median CPU seconds of the calling thread per step of each callable, interleaved."""
    for _ in range(warmup):
        for step in steps.values():
            step(x)
    times = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            getattr(step, 'reset', _nothing)()
            t = time.thread_time()
            step(x)
            times[name].append(time.thread_time() - t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _nothing():
    pass


@contextlib.contextmanager
def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def host_step(model: torch.nn.Module, mode: str, dtype: str = 'fp32') -> Callable:
    """One step of the backbone alone: forward (+ the mean of the outputs and backward in
    'train'), under autocast for 'bf16'/'fp16'. The gradients of the step before are let go
    first, outside what is counted and timed (:func:`count_python_calls` and the others call
    ``step.reset`` before ``step``), as an optimizer's ``zero_grad`` does: the harness's own
    host work is not the backbone's."""
    from .backbone import step_fn
    step = step_fn(model, 'infer', dtype)  # autocast and no_grad, as every comparison runs
    if mode == 'train':
        model.train()
        amp = torch.autocast('cpu', dtype=DTYPES[dtype]) if dtype != 'fp32' else None
        params = [p for p in model.parameters() if p.requires_grad]

        def step(x):
            with amp or contextlib.nullcontext():
                outs = model(x)
            sum(o.float().mean() for o in outs).backward()
            return outs

        def reset():
            for p in params:
                p.grad = None
        step.reset = reset
    else:
        step.reset = lambda: None
    return step


def host_steps(mode: str, dtype: str, batch: int, drop_path_rate: float = 0.2,
               freeze_tables: bool = True) -> Tuple[Dict[str, Callable], torch.Tensor]:
    """({'mmdet': step, 'ours': step}, input) of one host case (:func:`host_step`)."""
    stock, ours = build_host_pair(drop_path_rate, freeze_tables)
    steps = {'mmdet': host_step(stock, mode, dtype), 'ours': host_step(ours, mode, dtype)}
    torch.manual_seed(1)
    return steps, torch.randn(batch, 3, *HOST_SHAPE)


def _side_counts(step: Callable, x, by_op: bool = True) -> dict:
    step(x)  # warm-up: plans and caches built, as after a device's first step
    ops = count_top_level_ops(step, x)
    counts = dict(python_calls=count_python_calls(step, x), aten_ops=sum(ops.values()))
    if by_op:
        counts['aten_by_op'] = dict(ops.most_common())
    return counts


def _ratios(sides: dict) -> dict:
    return {key: sides['ours'][key] / sides['mmdet'][key]
            for key in ('python_calls', 'python_calls_tables_trained', 'aten_ops', 'thread_ms')
            if key in sides['ours'] and sides['mmdet'].get(key)}


def host_record(mode: str, dtype: str = 'fp32', batch: int = 2, drop_path_rate: float = 0.2,
                repeats: int = 30, timed: bool = True) -> dict:
    """One record: Python calls and top-level ATen ops per step of each side (tables frozen;
    in 'train' the Python calls with trained tables too), and with ``timed`` the thread CPU
    time per step on one thread (tables frozen); ratios are ours / mmdet's."""
    from swin_rpe_plugin.ops.dispatch import force_backend
    record = dict(kind='host', arch='host-tiny', shape=list(HOST_SHAPE), batch=batch, mode=mode,
                  dtype=dtype, drop_path_rate=drop_path_rate, backend='generic', sides={})
    with force_backend('generic'), _threads(1):
        steps, x = host_steps(mode, dtype, batch, drop_path_rate)
        record['sides'] = {name: _side_counts(step, x) for name, step in steps.items()}
        if mode == 'train':
            trained, x2 = host_steps(mode, dtype, batch, drop_path_rate, freeze_tables=False)
            for name, step in trained.items():
                step(x2)
                record['sides'][name]['python_calls_tables_trained'] = \
                    count_python_calls(step, x2)
        if timed:
            for name, seconds in thread_times(steps, x, repeats).items():
                record['sides'][name]['thread_ms'] = seconds * 1e3
    record['ratios'] = _ratios(record['sides'])
    return record


def detector_host_record(name: str = 'mask-rcnn', shape: Tuple[int, int] = (320, 320),
                         batch: int = 2, mode: str = 'train') -> dict:
    """The host counts of a whole model's step (mmdet's Swin-T config, our backbone against
    mmdet's, same weights and batch: ``benchmarks/detector.py``) and of its backbone alone on
    the same images, tables frozen, on the generic path: what share of a user's step the
    backbone is. A 'train' step is the losses and their backward (no optimizer step)."""
    from swin_rpe_plugin.ops.dispatch import force_backend
    from .detector import build_detector, detector_step, synthetic_batch
    stock = build_detector(name, 'mmdet')
    ours = build_detector(name, 'ours', stock.state_dict())
    record = dict(kind='host-detector', arch=name, shape=list(shape), batch=batch, mode=mode,
                  dtype='fp32', backend='generic', sides={})
    with force_backend('generic'), _threads(1):
        data = synthetic_batch(stock, shape, mode == 'train', batch)
        for side, model in (('mmdet', stock), ('ours', ours)):
            for p_name, p in model.named_parameters():
                if 'relative_position_bias_table' in p_name:
                    p.requires_grad_(False)
            params = [p for p in model.parameters() if p.requires_grad]
            run = detector_step(model, mode, release_grads=False)

            def step(data, run=run):
                return run(data)

            def reset(params=params):
                for p in params:
                    p.grad = None
            step.reset = reset
            whole = _side_counts(step, data, by_op=False)
            backbone = host_step(model.backbone, mode)
            alone = _side_counts(backbone, data['inputs'], by_op=False)
            model.train(mode == 'train')
            record['sides'][side] = dict(whole, backbone_python_calls=alone['python_calls'],
                                         backbone_aten_ops=alone['aten_ops'])
    record['ratios'] = _ratios(record['sides'])
    return record
