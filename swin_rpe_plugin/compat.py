"""What this torch has: the one place that knows how torch versions differ.

Supported: torch >= 2.1 on Python >= 3.8 (:data:`TORCH_FLOOR`). Each entry below names the oldest
torch that has the feature and what older ones get instead, so the rest of the package asks here
and never compares versions or reaches into ``torch._C`` / ``torch.ops.mkldnn`` itself. The table
of what each torch gets is ``docs/compatibility.md``; ``tests/test_compat.py`` runs every
fallback on whatever torch runs the tests.

Imports torch only.
"""
import contextlib
import functools
import inspect
import os
import re
from typing import Any, Callable, ContextManager, Optional, Tuple

import torch
from torch import Tensor

__all__ = ['TORCH_FLOOR', 'TORCH_VERSION', 'check_torch', 'HAS_CUSTOM_OP', 'custom_op',
           'is_compiling', 'is_exporting', 'compiler_disable', 'HAS_COMPILE', 'index_sizes', 'gradient_edge', 'autocast_available',
           'autocast_enabled', 'autocast_dtype', 'autocast_context', 'native_products',
           'onednn_linear_op', 'softmax_backward_data', 'WeakIdKeyDictionary',
           'cpu_capability', 'HAS_DYNAMO_EXPORTER', 'HAS_SAFE_GLOBALS',
           'TRACED_SDPA_EXPORTS', 'register_load_state_dict_pre_hook', 'SDPA_TAKES_FLOAT_MASK', 'default_device',
           'CPU_FLASH_TAKES_MASK',
           'gelu_backward_', 'weights_only_globals', 'apply_function', 'has_forward_hooks']

TORCH_FLOOR = (2, 1)


def parse_version(version: str) -> Tuple[int, int]:
    """(major, minor) of a torch version string: '2.1.2+cu121' -> (2, 1)."""
    match = re.match(r'(\d+)\.(\d+)', version)
    if match is None:
        raise ValueError(f'cannot read a torch version from {version!r}')
    return int(match.group(1)), int(match.group(2))


TORCH_VERSION = parse_version(torch.__version__)


def check_torch(version: Tuple[int, int] = TORCH_VERSION, text: str = torch.__version__) -> None:
    """Raise ImportError in one line when ``version`` is below the floor."""
    if version < TORCH_FLOOR:
        floor = '.'.join(map(str, TORCH_FLOOR))
        raise ImportError(f'swin_rpe_plugin needs torch >= {floor}, found torch {text}: '
                          f'install torch>={floor} (mmdet 3.3 users: torch 2.1 with mmcv 2.1.0)')


# --- Custom ops (torch.library.custom_op: torch >= 2.4, used from 2.5) ----------------------
# torch 2.4's first custom_op loses the autograd registration of ours under grad mode (their
# backward is refused: 101 of its core tests fail with it), so 2.4 takes the eager fallback too.
# SWIN_RPE_EAGER_OPS=1 registers none and runs the fallback older torches get, on any torch
# (tests run that path on the newest torch with it).
HAS_CUSTOM_OP = (hasattr(torch.library, 'custom_op') and TORCH_VERSION >= (2, 5)
                 and os.environ.get('SWIN_RPE_EAGER_OPS', '0') != '1')


class EagerOp:
    """What a torch without ``torch.library.custom_op`` gets for one: the same function, called
    directly, and the same registered backward through a ``torch.autograd.Function``. So the
    math is one piece of code on every torch; only registration (for compile and export)
    differs. ``register_fake`` keeps the shape function for reading; nothing calls it here."""

    def __init__(self, fn: Callable):
        functools.update_wrapper(self, fn)
        self._fn = self._init_fn = fn  # _init_fn: the body, as torch's CustomOpDef names it
        self._signature = inspect.signature(fn)
        self._function: Optional[type] = None

    def register_fake(self, fn: Callable) -> Callable:
        return fn

    def register_autograd(self, backward: Callable, *, setup_context: Callable) -> None:
        fn = self._fn

        class Function(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *args):
                output = fn(*args)
                setup_context(ctx, args, output)
                return output

            @staticmethod
            def backward(ctx, *grads):
                return backward(ctx, *grads)

        Function.__name__ = Function.__qualname__ = f'{fn.__name__}_function'
        self._function = Function

    def __call__(self, *args, **kwargs):
        if kwargs or len(args) < len(self._signature.parameters):
            bound = self._signature.bind(*args, **kwargs)
            bound.apply_defaults()
            args = bound.args
        if self._function is not None and torch.is_grad_enabled() and any(
                isinstance(a, Tensor) and a.requires_grad for a in args):
            return self._function.apply(*args)
        return self._fn(*args)


def custom_op(name: str, mutates_args: Tuple[str, ...] = ()) -> Callable:
    """``torch.library.custom_op(name, mutates_args=...)`` where the torch has it (>= 2.4),
    else an :class:`EagerOp` with the same ``register_fake`` / ``register_autograd``."""
    if HAS_CUSTOM_OP:
        return torch.library.custom_op(name, mutates_args=mutates_args)
    return EagerOp


# --- Compiler and exporter probes -----------------------------------------------------------
# torch.compiler.is_compiling: 2.3; torch._dynamo.is_compiling before (dynamo folds both to
# True while tracing). torch.compiler.is_exporting: 2.4 (torch.export's dynamo mode; older
# torches export ONNX through TorchScript, which torch.jit.is_tracing reports).
if hasattr(torch.compiler, 'is_compiling'):
    is_compiling = torch.compiler.is_compiling
else:  # torch 2.1, 2.2
    import torch._dynamo
    is_compiling = torch._dynamo.is_compiling

if hasattr(torch.compiler, 'is_exporting'):
    is_exporting = torch.compiler.is_exporting
else:
    def is_exporting() -> bool:
        """False: this torch has no dynamo exporter the package supports."""
        return False

compiler_disable = torch.compiler.disable  # torch >= 2.1

# torch.compile needs dynamo, which each torch supports on some Pythons only (2.2 and 2.3: not
# 3.12, which came with 2.4). Without it torch.compile raises torch's own one-line error.
from torch._dynamo.eval_frame import is_dynamo_supported  # noqa: E402

HAS_COMPILE = is_dynamo_supported()

# Sizes in the index arithmetic of a compiled graph (inductor >= 2.5 is tested with them as
# symbolic scalars): torch 2.1's inductor types any symbolic scalar other than a bare symbol
# (s0 * s1, (s0 + 6) // 7) as float32 in elementwise ops, so window plans came out float and
# could not index. Older torches get such sizes as 0-d long tensors under compile instead.
_INDUCTOR_TYPES_SIZE_EXPRESSIONS = TORCH_VERSION >= (2, 5)


def index_sizes(device: Optional[torch.device], *sizes):
    """``sizes`` for elementwise index arithmetic: themselves, or 0-d long tensors while torch
    (< 2.5) compiles a graph (not exports: the exporters take symbolic scalars as they are)."""
    if _INDUCTOR_TYPES_SIZE_EXPRESSIONS or not is_compiling() or is_exporting():
        return sizes
    return tuple(torch.full((), s, dtype=torch.long, device=device) for s in sizes)


# torch 2.1's inductor cannot compile a window plan traced into the graph that uses it: its
# index propagation turns the token gather's negative-index wrap into a sympy Where that its
# simplifier rejects ("non-commutative expressions are not supported"). Below 2.5 the plan is
# then the cached eager one (a graph break per stage), an input of the graphs that use it.
_COMPILE_TRACES_WINDOW_PLAN = TORCH_VERSION >= (2, 5)


def plan_outside_graph() -> bool:
    """True while a torch < 2.5 compiles (not exports): window plans are built eagerly."""
    return not _COMPILE_TRACES_WINDOW_PLAN and is_compiling() and not is_exporting()


def gradient_edge(t: Tensor) -> Any:
    """``torch.autograd.graph.get_gradient_edge(t)`` (torch >= 2.2): a root for
    ``torch.autograd.grad`` that does not keep ``t`` alive. A torch whose ``autograd.grad``
    cannot take an edge as its output (2.1 has none; 2.4 asks it ``is_nested``) gets ``t``
    itself: the same gradients, with ``t`` held until they are made."""
    return torch.autograd.graph.get_gradient_edge(t) if _GRAD_TAKES_EDGES else t


def _grad_takes_edges() -> bool:
    """Asked once at import, outside any tensor mode (meta, fake) a later caller may be under."""
    getter = getattr(torch.autograd.graph, 'get_gradient_edge', None)
    if getter is None:
        return False
    x = torch.ones(1, device='cpu', requires_grad=True)
    with torch.enable_grad():
        y = x * 2
    try:  # asked the way ops/recompute.py asks it
        torch.autograd.grad(getter(y), x, torch.ones(1, device='cpu'))
    except (AttributeError, TypeError, RuntimeError):
        return False
    return True


_GRAD_TAKES_EDGES = _grad_takes_edges()
# torch.onnx.export(dynamo=True) and torch.export.Dim: 2.5 (the path deploy/onnx.py takes).
HAS_DYNAMO_EXPORTER = TORCH_VERSION >= (2, 5) and hasattr(torch, 'export')
# The TorchScript ONNX exporter of torch 2.1-2.4 fails on SDPA's `scale` (its symbolic passes
# the float where a tensor attribute goes; seen on 2.1.2, 2.2.2, 2.4.1); 2.5+ export it. Where it
# fails, traced attention takes the explicit products, which is what ONNX runs anyway.
TRACED_SDPA_EXPORTS = TORCH_VERSION >= (2, 5)
# torch.serialization.add_safe_globals: 2.4; entries named by (object, 'module.name'), which the
# mmengine allow-list needs: 2.5. Without them, a restricted unpickler resolves the same list.
HAS_SAFE_GLOBALS = hasattr(torch.serialization, 'add_safe_globals') and TORCH_VERSION >= (2, 5)


# --- Autocast queries (per-device forms: torch >= 2.4) --------------------------------------
# torch 2.4 has them but dynamo cannot trace its is_autocast_available: 2.4 asks the old way.
_HAS_DEVICE_AUTOCAST = (hasattr(torch, 'get_autocast_dtype') and TORCH_VERSION >= (2, 5)
                        and hasattr(torch.amp, 'is_autocast_available'))


def _ask_autocast_available(device_type: str) -> bool:
    if _HAS_DEVICE_AUTOCAST:
        try:
            return torch.amp.is_autocast_available(device_type)
        except RuntimeError:  # a device type this torch does not know
            return False
    return device_type in ('cpu', 'cuda')  # what torch 2.1-2.3 autocast covers in core


# Read once per device type: it cannot change within a process, and dynamo cannot trace the
# query on every torch (2.11 breaks the graph on torch._C._is_autocast_available in forward).
_AUTOCAST_AVAILABLE = {device: _ask_autocast_available(device) for device in
                       ('cpu', 'cuda', 'meta', 'xpu', 'mps', 'hpu', 'mtia', 'privateuseone')}


def autocast_available(device_type: str) -> bool:
    """Whether ``device_type`` has autocast at all (``meta`` has none: asking it raises).
    Answered from a table read at import (another device type is asked once, then kept)."""
    known = _AUTOCAST_AVAILABLE.get(device_type)
    if known is None:
        known = _AUTOCAST_AVAILABLE[device_type] = _ask_autocast_available(device_type)
    return known


def autocast_enabled(device_type: str) -> bool:
    if not autocast_available(device_type):
        return False
    if _HAS_DEVICE_AUTOCAST:
        return torch.is_autocast_enabled(device_type)
    return torch.is_autocast_cpu_enabled() if device_type == 'cpu' \
        else torch.is_autocast_enabled()


def autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The dtype autocast casts to on ``device_type`` (whether or not it is on); None where
    the device has no autocast."""
    if not autocast_available(device_type):
        return None
    if _HAS_DEVICE_AUTOCAST:
        return torch.get_autocast_dtype(device_type)
    return torch.get_autocast_cpu_dtype() if device_type == 'cpu' \
        else torch.get_autocast_gpu_dtype()


def autocast_context(device_type: str, dtype: Optional[torch.dtype] = None,
                     enabled: bool = False) -> ContextManager:
    """``torch.autocast(device_type, dtype, enabled)`` where the device has autocast, else a
    null context (nothing to switch). ``autocast_context(device)`` turns autocast off."""
    if not autocast_available(device_type):
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=dtype, enabled=enabled)


# --- Modules and kernels ---------------------------------------------------------------------
def register_load_state_dict_pre_hook(module: torch.nn.Module, hook: Callable) -> Any:
    """``module.register_load_state_dict_pre_hook(hook)`` (public: torch >= 2.5; before, the
    private form with ``with_module=True``, which calls ``hook`` the same way)."""
    if hasattr(module, 'register_load_state_dict_pre_hook'):
        return module.register_load_state_dict_pre_hook(hook)
    return module._register_load_state_dict_pre_hook(hook, with_module=True)


def default_device() -> torch.device:
    """``torch.get_default_device()`` (torch >= 2.3); before, the device a new tensor gets,
    which ``torch.set_default_device`` (torch >= 2.0) decides the same way."""
    getter = getattr(torch, 'get_default_device', None)
    return getter() if getter is not None else torch.empty(()).device


_functorch_active = torch._C._are_functorch_transforms_active


def apply_function(function: type, *args) -> Any:
    """``function.apply(*args)`` for an autograd Function written as ``forward(ctx, ...)``,
    called outside compilers (dynamo cannot trace the C ``apply``: callers run plain ops there).

    ``Function.apply`` (every torch from 2.1 on) first walks its arguments with a pytree for
    functorch's dead wrappers, about 20 Python calls a call with a block's ten arguments, then
    calls the C ``apply``; outside functorch transforms (vmap, grad) that walk finds nothing,
    so this calls the C ``apply`` directly. Under a transform, the full ``Function.apply``."""
    if _functorch_active():
        return function.apply(*args)
    return super(torch.autograd.Function, function).apply(*args)


@functools.lru_cache(maxsize=None)
def _gelu_backward_out_works(device_type: str) -> bool:
    g = torch.zeros(2, device=device_type)
    try:
        torch.ops.aten.gelu_backward.grad_input(g, g, approximate='none', grad_input=g)
    except (TypeError, RuntimeError, NotImplementedError):
        return False
    return True


def gelu_backward_(grad: Tensor, x: Tensor) -> Tensor:
    """The exact GELU's gradient at x written over ``grad`` by autograd's own kernel (its out
    variant). torch 2.1's meta kernel lacks that variant: there, a fresh gradient copied in."""
    if grad.device.type != 'meta' or _gelu_backward_out_works('meta'):
        return torch.ops.aten.gelu_backward.grad_input(grad, x, approximate='none',
                                                       grad_input=grad)
    return grad.copy_(torch.ops.aten.gelu_backward(grad, x))


def _sdpa_takes_float_mask() -> bool:
    q = torch.zeros(1, 1, 2, 8, dtype=torch.bfloat16)
    try:
        torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=torch.zeros(2, 2))
    except RuntimeError:
        return False
    return True


# Whether CPU scaled_dot_product_attention takes a float32 mask next to bf16 q, k, v (torch 2.1
# wants the mask in q's dtype). Asked of SDPA itself, on two tokens.
SDPA_TAKES_FLOAT_MASK = _sdpa_takes_float_mask()


def _cpu_flash_takes_mask() -> bool:
    choice = getattr(torch, '_fused_sdp_choice', None)  # private: ATen's own kernel choice
    if choice is None:
        return False
    q = torch.zeros(1, 1, 2, 8)
    try:
        return int(choice(q, q, q, torch.zeros(1, 1, 2, 2), 0.0, False)) == \
            int(torch.backends.cuda.SDPBackend.FLASH_ATTENTION)
    except (RuntimeError, TypeError, AttributeError):
        return False


# Whether SDPA's CPU flash kernel takes an additive mask (newer torches); torch 2.1 sends a
# masked call to its math path, which builds every attention matrix, so the CPU fast path then
# takes its own explicit products (ops/dispatch.py). Asked of ATen's kernel choice; False if
# that private entry is missing (the explicit products are right on any torch).
CPU_FLASH_TAKES_MASK = _cpu_flash_takes_mask()


def weights_only_globals() -> dict:
    """{'module.name': object} that ``torch.load(weights_only=True)`` allows by itself
    (tensors, storages, dtypes, OrderedDict), from torch's own unpickler (private); a minimal
    equivalent where that entry is missing."""
    try:
        from torch._weights_only_unpickler import _get_allowed_globals
        return dict(_get_allowed_globals())
    except (ImportError, AttributeError):
        import collections
        import torch._utils as utils
        entries = [collections.OrderedDict, torch.Size, torch.Tensor,
                   torch.nn.Parameter, utils._rebuild_tensor_v2, utils._rebuild_parameter]
        table = {f'{e.__module__}.{e.__qualname__}': e for e in entries}
        table.update({str(d): d for d in (torch.float16, torch.bfloat16, torch.float32,
                                          torch.float64, torch.int64, torch.uint8, torch.bool)})
        return table


# --- Private CPU entries (torch.ops.mkldnn, torch._C): each with its fallback -------------
def _mkldnn_query(name: str) -> bool:
    """A ``torch.ops.mkldnn._is_mkldnn_*_supported()`` answer; False where the query is
    missing (``_is_mkldnn_fp16_supported``: torch >= 2.2) or fails."""
    try:
        return bool(getattr(torch.ops.mkldnn, name)())
    except (AttributeError, RuntimeError):
        return False


def native_products() -> dict:
    """{dtype: whether this CPU multiplies it natively (avx512_bf16/AMX, avx512_fp16)}:
    elsewhere oneDNN falls back to reference kernels many times slower than float32."""
    return {torch.bfloat16: _mkldnn_query('_is_mkldnn_bf16_supported'),
            torch.float16: _mkldnn_query('_is_mkldnn_fp16_supported')}


def onednn_linear_op() -> Optional[Any]:
    """oneDNN's ``torch.ops.mkldnn._linear_pointwise`` (what inductor emits for frozen CPU
    linears), or None where the torch lacks it or oneDNN: callers then take ``F.linear``."""
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):
        return None


def softmax_backward_data(grad: Tensor, output: Tensor, dim: int,
                          input_dtype: torch.dtype) -> Tensor:
    """``output * (grad - (grad * output).sum(dim))``, ATen's fused kernel where present."""
    kernel = getattr(torch, '_softmax_backward_data', None)
    if kernel is not None:
        return kernel(grad, output, dim, input_dtype)
    return output * (grad - (grad * output).sum(dim, keepdim=True))


from torch.utils.weak import WeakIdKeyDictionary  # noqa: E402  (torch >= 2.0)


def cpu_capability() -> str:
    """ATen's CPU instruction set ('AVX512', 'AVX2', ...); 'DEFAULT' where unknown."""
    getter = getattr(getattr(torch.backends, 'cpu', None), 'get_cpu_capability', None)
    return getter() if getter is not None else 'DEFAULT'


_module_globals = torch.nn.modules.module


def has_forward_hooks(*modules: torch.nn.Module) -> bool:
    """Whether calling any of ``modules`` would run a forward hook or pre-hook: its own, or a
    global one (``register_module_forward_hook``). The dicts are torch's private attributes
    (every torch from 2.1 has them under these names); ``nn.Module.__call__`` reads the same."""
    if _module_globals._global_forward_hooks or _module_globals._global_forward_pre_hooks:
        return True
    for module in modules:
        if module._forward_hooks or module._forward_pre_hooks:
            return True
    return False


def fully_shard() -> Callable:
    """torch's FSDP2 ``fully_shard``: ``torch.distributed.fsdp`` from torch 2.6 on,
    ``torch.distributed._composable.fsdp`` on 2.4-2.5; below 2.4 there is none."""
    try:
        from torch.distributed.fsdp import fully_shard as shard
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard as shard
        except ImportError:
            raise RuntimeError(f'FSDP2 (fully_shard) needs torch >= 2.4 (this is '
                               f'{torch.__version__}): use FullyShardedDataParallel with the '
                               'policy of swin_wrap_policy(model) (engine/sharding.py)') from None
    return shard


HAS_FULLY_SHARD = TORCH_VERSION >= (2, 4)
# torch's FSDP on a CPU (device_id=cpu, gloo): torch 2.1 asks for CUDA streams ("Stream() takes
# no arguments"), torch 2.11 and 2.13 train (tests/reliability/test_distributed_sharded.py);
# counted from 2.4 on, the first torch with FSDP2, the versions between 2.1 and 2.11 unmeasured.
FSDP_ON_CPU = TORCH_VERSION >= (2, 4)
