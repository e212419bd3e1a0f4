"""The one dispatch point between the CPU fast paths and standard PyTorch.

The fast paths (oneDNN linears, the CPU flash attention split into unmasked and masked windows,
the attention backward recomputed per image) are written for CPU. Everywhere else (CUDA, any
other device, tracers, torch.compile) the core runs standard PyTorch: ``F.linear`` and one
``F.scaled_dot_product_attention`` call with bias and mask as ``attn_mask``, so each device
picks its own kernels (on CUDA the memory-efficient one, which also returns the mask gradient).

``SWIN_RPE_BACKEND=generic`` (or :func:`force_backend`) sends CPU through the standard path
too; tests use it to run the path other devices take. ``auto`` (the default) chooses by device.

Mixed precision: :func:`compute_dtype` is the dtype the matrix products run in, the autocast
dtype inside an autocast region. Functions that bypass autocast (custom autograd functions,
oneDNN ops) cast to it themselves, so autocast means the same on every path.

Kernel choices (:func:`choose_kernel`): where two libraries compute the same product (oneDNN's
matmul or MKL's sgemm behind ``F.linear``), the first call of each shape times both on its
real operands and the faster one serves that shape for the rest of the process. On AMD CPUs
MKL takes a slow path and oneDNN wins; on Intel they are close and it varies by shape.
``SWIN_RPE_LINEAR=onednn|mkl`` (or :func:`force_kernel`) forces one; tests run each.

Imports torch only.
"""
import contextlib
import os
import time
from typing import Callable, Dict, Iterator, Optional

import torch
from torch import Tensor

__all__ = ['BACKENDS', 'backend', 'force_backend', 'use_cpu_fast_paths', 'compute_dtype',
           'is_tracing', 'KERNELS', 'choose_kernel', 'force_kernel', 'kernel_choices']

BACKENDS = ('auto', 'generic')
_forced = [None]  # set by force_backend; None defers to the environment variable


def backend() -> str:
    """'auto' or 'generic': force_backend's value, else $SWIN_RPE_BACKEND, else 'auto'."""
    name = _forced[0] or os.environ.get('SWIN_RPE_BACKEND', 'auto')
    if name not in BACKENDS:
        raise ValueError(f'SWIN_RPE_BACKEND={name!r} is not one of {BACKENDS}: unset it or '
                         'choose one of those')
    return name


@contextlib.contextmanager
def force_backend(name: str) -> Iterator[None]:
    """Run the enclosed code with backend ``name`` ('auto' or 'generic')."""
    if name not in BACKENDS:
        raise ValueError(f'backend must be one of {BACKENDS}, got {name!r}')
    previous, _forced[0] = _forced[0], name
    try:
        yield
    finally:
        _forced[0] = previous


def use_cpu_fast_paths(x: Tensor) -> bool:
    """True when x's computation may take the CPU-specific kernels.

    False on other devices, when the generic backend is forced, under torch.compile (inductor
    picks its own kernels) and under tracers (exporters and FLOP counters see plain ops).
    """
    if torch.compiler.is_compiling():  # checked first: the other checks break dynamo graphs
        return False
    return x.device.type == 'cpu' and not torch.jit.is_tracing() and backend() == 'auto'


def is_tracing(x: Tensor) -> bool:
    """True under a tracer, exporter or compiler, whose sizes may be symbolic: code must then
    compute from sizes without branching on them, caching by them or looping over them."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return True
    return any(isinstance(s, torch.SymInt) for s in x.shape)


def compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype of x's matrix products: autocast's inside an autocast region, else x's."""
    device = x.device.type
    if x.is_floating_point() and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


KERNELS = {'linear': ('onednn', 'mkl')}
_forced_kernels: Dict[str, Optional[str]] = {}
_choices: Dict[tuple, str] = {}


def _forced_kernel(kind: str) -> Optional[str]:
    name = _forced_kernels.get(kind) or os.environ.get(f'SWIN_RPE_{kind.upper()}')
    if name is not None and name not in KERNELS[kind]:
        raise ValueError(f'SWIN_RPE_{kind.upper()}={name!r} is not one of {KERNELS[kind]}: '
                         'unset it or choose one of those')
    return name


@contextlib.contextmanager
def force_kernel(kind: str, name: Optional[str]) -> Iterator[None]:
    """Use kernel ``name`` for ``kind`` in the enclosed code (None: measure)."""
    if name is not None and name not in KERNELS[kind]:
        raise ValueError(f'{kind} kernel must be one of {KERNELS[kind]}, got {name!r}')
    previous = _forced_kernels.get(kind)
    _forced_kernels[kind] = name
    try:
        yield
    finally:
        _forced_kernels[kind] = previous


def choose_kernel(kind: str, key: tuple, candidates: Dict[str, Callable[[], object]]) -> str:
    """The kernel of ``kind`` for ``key``: forced, cached, or measured now.

    Measuring runs each candidate twice on the caller's operands and keeps the faster second
    run (the first pays for allocation and oneDNN's primitive creation); the choice is cached
    per (kind, key) for the process. Call it only outside autograd (under no_grad).
    """
    forced = _forced_kernel(kind)
    if forced is not None:
        return forced
    cache_key = (kind, ) + key
    if cache_key not in _choices:
        times = {}
        for name, run in candidates.items():
            run()
            start = time.perf_counter()
            run()
            times[name] = time.perf_counter() - start
        _choices[cache_key] = min(times, key=times.get)
    return _choices[cache_key]


def kernel_choices() -> Dict[tuple, str]:
    """The choices measured so far, (kind, *key) -> kernel (for reports and tests)."""
    return dict(_choices)
