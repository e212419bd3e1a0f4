"""The one dispatch point between the CPU fast paths and standard PyTorch.

The fast paths (oneDNN linears, the CPU flash attention split into unmasked and masked windows,
the attention backward recomputed per chunk of windows) are written for a CPU's caches and
registered as torch.library ops, so eager and torch.compile run the same kernels. Everywhere
else (CUDA, any other device) the core runs the generic path, designed for GPUs, where each
kernel launch costs host time whatever its size: ``F.linear``, and one
``F.scaled_dot_product_attention`` call per layer for all windows of all images (bias + mask
broadcast, never materialised per window and image), with SDPA's own autograd, so each device
picks its own fused kernels forward and backward. No loop on it grows with the batch, the
windows or the image, and eager, tracers and compilers run the same ops (``attention.py``).
Nothing on it is CPU-specific: autocast is switched only where the device has it, window plans
are built on the CPU and moved to the device once (ops/plan.py);
``tests/ops/test_meta_device.py`` runs it forward and backward on ``meta``, and
``tests/benchmarks/test_kernel_budgets.py`` counts the kernels it launches there.

``SWIN_RPE_BACKEND=generic`` (or :func:`force_backend`) sends CPU through the generic path
too; tests use it to run the path other devices take. ``auto`` (the default) chooses by device.

Mixed precision: :func:`compute_dtype` is the dtype the matrix products run in, the autocast
dtype inside an autocast region. Functions that bypass autocast (custom autograd functions,
oneDNN ops) cast to it themselves, so autocast means the same on every path.

Kernel choices (:func:`choose_kernel`): where two libraries compute the same product (oneDNN's
matmul or MKL's sgemm behind ``F.linear``), a fixed rule per kind, device, dtype and CPU class
(vendor and the instruction set ATen's kernels use) picks one (:data:`KERNEL_RULES`), never a
race at first use: the two libraries sum in different orders, so a timed choice made two runs
with one seed end with different weights. The measurements behind each rule are in
``docs/kernel-rules.md``. ``SWIN_RPE_LINEAR``, ``SWIN_RPE_LINEAR_GELU`` and
``SWIN_RPE_ATTENTION`` (or :func:`force_kernel`) force one; tests run each.

Differences between torch versions are asked of ``swin_rpe_plugin.compat``.

Imports torch only.
"""
import contextlib
import os
from typing import Dict, Iterator, Optional

import torch
from torch import Tensor

from ..compat import (CPU_FLASH_TAKES_MASK, HAS_CUSTOM_OP, SDPA_TAKES_FLOAT_MASK, autocast_available, autocast_context, autocast_dtype,
                      autocast_enabled, cpu_capability, is_compiling, is_exporting)

__all__ = ['BACKENDS', 'backend', 'force_backend', 'use_cpu_fast_paths', 'block_kernels', 'compute_dtype',
           'autocast_state', 'autocast_context', 'is_tracing', 'KERNELS', 'KERNEL_RULES',
           'DEFAULT_KERNELS', 'CPU_CLASS', 'cpu_class', 'choose_kernel', 'force_kernel']

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

    False on other devices, when the generic backend is forced, and under exporters and
    tracers (ONNX, torch.export and FLOP counters see plain ops). True under torch.compile on
    CPU: the fast paths are registered ops (``swin_rpe::linear``, ``swin_rpe::window_attention``
    with their shape functions and backwards), which the compiler calls as they are.
    """
    if is_compiling():  # checked first: jit's tracing check breaks dynamo graphs
        # Below torch 2.4 the fast paths are not registered ops: the compiler gets plain ones.
        return (HAS_CUSTOM_OP and not is_exporting() and x.device.type == 'cpu'
                and backend() == 'auto')
    return x.device.type == 'cpu' and not torch.jit.is_tracing() and backend() == 'auto'


def block_kernels(x: Tensor) -> Optional[str]:
    """The kernels the blocks of one backbone forward on x run (``ops/block.py``): 'cpu' where
    the CPU fast paths apply, 'generic' on every other device (and on the CPU under the
    generic backend); None under tracers, exporters and compilers, which see the modules'
    plain ops (they differentiate and fuse those themselves). Asked once per forward."""
    if is_tracing(x):
        return None
    return 'cpu' if use_cpu_fast_paths(x) else 'generic'


def is_tracing(x: Tensor) -> bool:
    """True under a tracer, exporter or compiler, whose sizes may be symbolic: code must then
    compute from sizes without branching on them, caching by them or looping over them."""
    if is_compiling() or torch.jit.is_tracing():
        return True
    return torch.SymInt in map(type, x.shape)  # one call, not a generator's per size


def compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype of x's matrix products: autocast's inside an autocast region, else x's."""
    device = x.device.type
    if x.is_floating_point() and autocast_enabled(device):
        return autocast_dtype(device)
    return x.dtype


def autocast_state(device_type: str) -> tuple:
    """(device_type, dtype, enabled) of autocast for the device, to restore it later with
    :func:`autocast_context`; (device_type, None, False) on devices that have no autocast
    (``meta``, where even asking raises)."""
    if not autocast_available(device_type):
        return device_type, None, False
    return device_type, autocast_dtype(device_type), autocast_enabled(device_type)




# 'linear': every product of a linear layer; 'linear_gelu': fc1 at inference, whose GELU
# oneDNN applies in the product's epilogue (MKL: the product, then a GELU pass).
# 'attention': the forward of the CPU fast path's window attention, SDPA's flash kernel or
# the explicit products (per chunk of windows: q k^T, bias + mask, softmax, @ v), ops/attention.py.
KERNELS = {'linear': ('onednn', 'mkl'), 'linear_gelu': ('onednn', 'mkl'),
           'attention': ('flash', 'explicit')}
_CPU_CLASSES = [f'{vendor}-{isa}' for vendor in ('amd', 'intel', 'other')
                for isa in ('avx512', 'avx2')]
# (kind, device type, dtype, CPU class) -> kernel; anything not listed takes the kind's default
# (the standard library). bf16 without AVX-512 is MKL's because oneDNN has no bf16 inner product
# there; on Intel with AMX it is F.linear's too, which was faster there (see the module docstring).
# fc1 + GELU at inference is oneDNN's on AVX-512, where the fused epilogue saves two passes of the
# 4C-wide output and time; on AVX2 its GELU epilogue is slower than MKL's product and a GELU pass
# (see the module docstring). The attention forward is the flash kernel's (the default) but in bf16
# on AMD AVX-512 (Zen 5), where the explicit products took 57 ms against flash's 82.
KERNEL_RULES: Dict[tuple, str] = {
    ('linear', 'cpu', torch.float32, 'amd-avx512'): 'onednn',
    ('linear', 'cpu', torch.bfloat16, 'amd-avx512'): 'onednn',
    ('linear', 'cpu', torch.bfloat16, 'other-avx512'): 'onednn',
    **{('linear_gelu', 'cpu', dtype, cpu): 'onednn' for cpu in _CPU_CLASSES
       if cpu.endswith('avx512') for dtype in (torch.float32, torch.bfloat16)},
    ('attention', 'cpu', torch.bfloat16, 'amd-avx512'): 'explicit',
}
DEFAULT_KERNELS = {'linear': 'mkl', 'linear_gelu': 'mkl', 'attention': 'flash'}
_forced_kernels: Dict[str, Optional[str]] = {}


def _forced_kernel(kind: str) -> Optional[str]:
    name = _forced_kernels.get(kind) or os.environ.get(f'SWIN_RPE_{kind.upper()}')
    if name is not None and name not in KERNELS[kind]:
        raise ValueError(f'SWIN_RPE_{kind.upper()}={name!r} is not one of {KERNELS[kind]}: '
                         'unset it or choose one of those')
    return name


@contextlib.contextmanager
def force_kernel(kind: str, name: Optional[str]) -> Iterator[None]:
    """Use kernel ``name`` for ``kind`` in the enclosed code (None: the rule's)."""
    if name is not None and name not in KERNELS[kind]:
        raise ValueError(f'{kind} kernel must be one of {KERNELS[kind]}, got {name!r}')
    previous = _forced_kernels.get(kind)
    _forced_kernels[kind] = name
    try:
        yield
    finally:
        _forced_kernels[kind] = previous


def cpu_class(vendor_id: str, capability: str) -> str:
    """'amd-avx512', 'intel-avx2', ... from /proc/cpuinfo's vendor_id ('AuthenticAMD',
    'GenuineIntel', anything else: 'other') and ATen's CPU capability ('AVX512*': 'avx512',
    anything else: 'avx2')."""
    vendor = {'AuthenticAMD': 'amd', 'GenuineIntel': 'intel'}.get(vendor_id, 'other')
    return f"{vendor}-{'avx512' if capability.startswith('AVX512') else 'avx2'}"


def _vendor_id() -> str:
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('vendor_id'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return ''


# Read once: the compiler cannot trace the queries, and they cannot change within a process.
CPU_CLASS = cpu_class(_vendor_id(), cpu_capability())


def choose_kernel(kind: str, device_type: str, dtype: torch.dtype,
                  cpu: Optional[str] = None) -> str:
    """The kernel of ``kind`` for products on ``device_type`` in ``dtype``: forced (by
    :func:`force_kernel` or ``$SWIN_RPE_<KIND>``), else :data:`KERNEL_RULES` for the CPU class
    ``cpu`` (default: this machine's, :data:`CPU_CLASS`). Never timed."""
    forced = _forced_kernel(kind)
    if forced is not None:
        return forced
    if kind == 'attention' and device_type == 'cpu' and not (
            CPU_FLASH_TAKES_MASK and (SDPA_TAKES_FLOAT_MASK or dtype == torch.float32)):
        # This torch's CPU flash kernel takes no additive mask (its math path would build
        # every attention matrix), or none in float32 next to bf16 q (torch 2.1): the
        # explicit products add the float32 bias + mask before a float32 softmax.
        return 'explicit'
    if cpu is None:
        cpu = CPU_CLASS if device_type == 'cpu' else None
    return KERNEL_RULES.get((kind, device_type, dtype, cpu), DEFAULT_KERNELS[kind])
