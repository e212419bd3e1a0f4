"""Shims for reading checkpoints safely across torch versions.

Serves torch >= 2.6 (``torch.load`` defaults to ``weights_only=True``; here torch 2.13) with
mmengine 0.10.x, whose Runner saves ``meta`` and ``message_hub`` holding numpy arrays/scalars and
``mmengine.logging.HistoryBuffer`` objects. Without an allow-list, torch refuses those
checkpoints, which breaks ``load_from`` and ``--resume``. It can go once mmengine saves plain
data (or registers its own safe globals). Below torch 2.4 (no ``safe_globals``) nothing is
registered: those versions unpickle anything, and we pass ``weights_only=True`` ourselves.

The allow-list holds data classes only, never a general callable: ``builtins.getattr`` (which
HistoryBuffer pickles use to name its statistics methods, e.g. ``getattr(HistoryBuffer, 'min')``)
is replaced by :func:`history_buffer_getattr`, which resolves nothing else.
"""
import pickle
from typing import Any, List

import torch

from ..compat import HAS_SAFE_GLOBALS  # noqa: E402


def history_buffer_getattr(obj: Any, name: str) -> Any:
    """``getattr`` limited to the statistics methods of mmengine's HistoryBuffer."""
    from mmengine.logging import HistoryBuffer
    allowed = {'min', 'max', 'current', 'mean'} | set(HistoryBuffer._statistics_methods)
    method = HistoryBuffer.__dict__.get(name) if obj is HistoryBuffer and name in allowed \
        else None
    if not callable(method):
        raise pickle.UnpicklingError(
            f'refused getattr({getattr(obj, "__name__", type(obj).__name__)}, {name!r}) while '
            'loading with weights_only=True: only HistoryBuffer statistics methods are allowed')
    return method


def _numpy_globals() -> List[Any]:
    import numpy as np
    entries: List[Any] = [np.ndarray, np.dtype]
    # numpy < 2 pickles as numpy.core.multiarray.*, numpy >= 2 as numpy._core.multiarray.*
    for module in ('numpy.core.multiarray', 'numpy._core.multiarray'):
        for name in ('_reconstruct', 'scalar'):
            entries.append((getattr(np.core.multiarray, name), f'{module}.{name}'))
    dtypes = getattr(np, 'dtypes', None)  # numpy >= 1.25 pickles dtypes by class
    if dtypes is not None:
        entries += [getattr(dtypes, n) for n in dir(dtypes) if n.endswith('DType')]
    return entries


def mmengine_safe_globals() -> List[Any]:
    """The allow-list for mmengine Runner checkpoints (argument of ``torch.serialization``)."""
    from mmengine.logging import HistoryBuffer
    return _numpy_globals() + [HistoryBuffer, (history_buffer_getattr, 'builtins.getattr')]


def allow_mmengine_checkpoints() -> bool:
    """Let ``torch.load(weights_only=True)`` read mmengine's own checkpoints, process-wide.

    After this call, mmengine's ``load_checkpoint``, ``load_from`` and ``resume`` read Runner
    checkpoints under torch's safe unpickler; a pickle carrying code is still refused.
    Returns False when this torch has no allow-list (< 2.4).
    """
    if not HAS_SAFE_GLOBALS:
        return False
    torch.serialization.add_safe_globals(mmengine_safe_globals())
    return True


def safe_torch_load(path: str) -> Any:
    """``torch.load(weights_only=True)`` on CPU with the mmengine allow-list registered.

    Registered process-wide (idempotent), not through the ``safe_globals`` context manager,
    whose exit would remove the entries that ``allow_mmengine_checkpoints()`` had added before.
    """
    allow_mmengine_checkpoints()
    return torch.load(path, map_location='cpu', weights_only=True)
