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
import _compat_pickle
import pickle
from typing import Any, Dict, List, Tuple

import torch

from ..compat import HAS_SAFE_GLOBALS, weights_only_globals  # noqa: E402


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


def _qualified_name(entry: Any) -> Tuple[str, Any]:
    if isinstance(entry, tuple):
        return entry[1], entry[0]
    return f'{entry.__module__}.{entry.__qualname__}', entry


class _RestrictedUnpickler(pickle.Unpickler):
    """torch < 2.4 (no ``add_safe_globals``): an unpickler that resolves only torch's own
    weights-only globals and the mmengine allow-list, refusing anything else in the words
    torch's unpickler uses ('Unsupported global')."""
    allowed: Dict[str, Any] = {}

    def find_class(self, module: str, name: str) -> Any:
        # Python 2 names (protocol-2 pickles), mapped as pickle's own find_class does
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        found = self.allowed.get(f'{module}.{name}')
        if found is None:
            raise pickle.UnpicklingError(f'Weights only load failed: Unsupported global: '
                                         f'GLOBAL {module}.{name}')
        return found


class _RestrictedPickle:
    """What ``torch.load(pickle_module=...)`` takes: ``Unpickler`` and ``load``."""
    Unpickler = _RestrictedUnpickler
    __name__ = 'swin_rpe_restricted_pickle'

    @staticmethod
    def load(file, **kwargs):
        return _RestrictedUnpickler(file, **kwargs).load()


def safe_torch_load(path: str) -> Any:
    """``torch.load(weights_only=True)`` on CPU with the mmengine allow-list registered.

    Registered process-wide (idempotent), not through the ``safe_globals`` context manager,
    whose exit would remove the entries that ``allow_mmengine_checkpoints()`` had added before.
    Below torch 2.4 (no allow-list to register) the same globals, and no others, are resolved
    by a restricted unpickler instead.
    """
    if allow_mmengine_checkpoints():
        return torch.load(path, map_location='cpu', weights_only=True)
    if not _RestrictedUnpickler.allowed:
        import _codecs  # bytes in protocol-2 pickles (numpy scalars); newer torches allow it
        _RestrictedUnpickler.allowed = {**weights_only_globals(), '_codecs.encode': _codecs.encode,
                                        'builtins.bytes': bytes,
                                        **dict(map(_qualified_name, mmengine_safe_globals()))}
    return torch.load(path, map_location='cpu', pickle_module=_RestrictedPickle)
