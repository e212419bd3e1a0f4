"""Shims for reading checkpoints safely across torch versions.

Serves torch >= 2.6 (``torch.load`` defaults to ``weights_only=True``; here torch 2.13) with
mmengine 0.10.x, whose Runner saves ``meta`` and ``message_hub`` holding numpy arrays/scalars and
``mmengine.logging.HistoryBuffer`` objects. Without an allow-list, torch refuses those
checkpoints, which breaks ``load_from`` and ``--resume``. It can go once mmengine saves plain
data (or registers its own safe globals). Below torch 2.6 ``torch.load`` unpickles anything by
default, so mmengine's local-file loader is replaced by :func:`load_local_checkpoint` (the same
safe read on every torch); below torch 2.4 (no ``safe_globals``) a restricted unpickler resolves
the same allow-list.

The allow-list holds data classes only, never a general callable: ``builtins.getattr`` (which
HistoryBuffer pickles use to name its statistics methods, e.g. ``getattr(HistoryBuffer, 'min')``,
and sharded tensors their process-group state) is replaced by :func:`history_buffer_getattr`,
which resolves nothing else.
"""
import _compat_pickle
import os
import pickle
from typing import Any, Dict, List, Tuple

import torch

from ..compat import HAS_SAFE_GLOBALS, weights_only_globals  # noqa: E402


def history_buffer_getattr(obj: Any, name: str) -> Any:
    """``getattr`` limited to the statistics methods of mmengine's HistoryBuffer (and
    ``ShardedTensor.ProcessGroupState``, a data class sharded checkpoints name that way)."""
    from mmengine.logging import HistoryBuffer
    allowed = {'min', 'max', 'current', 'mean'} | set(HistoryBuffer._statistics_methods)
    method = HistoryBuffer.__dict__.get(name) if obj is HistoryBuffer and name in allowed \
        else None
    if name == 'ProcessGroupState' and torch.distributed.is_available():
        from torch.distributed._shard.sharded_tensor import ShardedTensor
        method = ShardedTensor.ProcessGroupState if obj is ShardedTensor else None
    if not callable(method):
        raise pickle.UnpicklingError(
            f'refused getattr({getattr(obj, "__name__", type(obj).__name__)}, {name!r}) while '
            'loading with weights_only=True: only HistoryBuffer statistics methods (and '
            'ShardedTensor.ProcessGroupState) are allowed')
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


def _sharded_tensor_globals() -> List[Any]:
    """torch's sharded-tensor data classes: what mmengine's FSDPStrategy saves per rank with
    ``state_dict_cfg='local'`` (``iter_N.pth/rank{r}.pth``); none where torch has no
    ``torch.distributed``."""
    if not torch.distributed.is_available():
        return []
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
    from torch.distributed._shard.sharded_tensor.metadata import (
        MEM_FORMAT_ENCODING, ShardedTensorMetadata, TensorProperties)
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    from torch.distributed.remote_device import _remote_device
    return [ShardMetadata, Shard, ShardedTensor, ShardedTensor.ProcessGroupState,
            MEM_FORMAT_ENCODING, ShardedTensorMetadata, TensorProperties, ChunkShardingSpec,
            _remote_device]


def mmengine_safe_globals() -> List[Any]:
    """The allow-list for mmengine Runner checkpoints (argument of ``torch.serialization``)."""
    from mmengine.logging import HistoryBuffer
    return _numpy_globals() + _sharded_tensor_globals() + [
        HistoryBuffer, (history_buffer_getattr, 'builtins.getattr')]


def _register_safe_globals() -> bool:
    """Add the allow-list to torch's process-wide one; False where torch has none (< 2.4)."""
    if not HAS_SAFE_GLOBALS:
        return False
    torch.serialization.add_safe_globals(mmengine_safe_globals())
    return True


def allow_mmengine_checkpoints() -> bool:
    """Let mmengine read its own Runner checkpoints safely, process-wide, on every torch.

    After this call, mmengine's ``load_checkpoint``, ``load_from`` and ``resume`` read local
    files through :func:`load_local_checkpoint`: Runner checkpoints load, a pickle carrying code
    is refused. Returns True (kept for callers that checked it).
    """
    _register_safe_globals()
    from mmengine.runner.checkpoint import CheckpointLoader
    CheckpointLoader.register_scheme(prefixes='', loader=load_local_checkpoint, force=True)
    return True


def load_local_checkpoint(filename: str, map_location: Any = None) -> Any:
    """mmengine's local-file checkpoint loader, reading through :func:`safe_torch_load`.

    mmengine's own calls ``torch.load`` without ``weights_only``, which unpickles code below
    torch 2.6. torch's opt-out, ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``, is honoured here too.
    """
    filename = os.path.expanduser(filename)
    if not os.path.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    if os.environ.get('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', '0').lower() in ('1', 'y', 'yes', 'true'):
        return torch.load(filename, map_location=map_location, weights_only=False)
    try:
        return safe_torch_load(filename, map_location)
    except pickle.UnpicklingError as err:
        reason = next((line.strip() for line in str(err).splitlines()
                       if 'unsupported global' in line.lower()), None)
        if reason is None:
            raise
        raise pickle.UnpicklingError(
            f'refused to load {filename!r}: its pickle needs objects outside the safe allow-list '
            f'({reason}). Only if you trust this file, set TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1'
        ) from None


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


def safe_torch_load(path: str, map_location: Any = 'cpu') -> Any:
    """``torch.load(weights_only=True)`` with the mmengine allow-list registered.

    Registered process-wide (idempotent), not through the ``safe_globals`` context manager,
    whose exit would remove the entries that ``allow_mmengine_checkpoints()`` had added before.
    Below torch 2.4 (no allow-list to register) the same globals, and no others, are resolved
    by a restricted unpickler instead.
    """
    if _register_safe_globals():
        return torch.load(path, map_location=map_location, weights_only=True)
    if not _RestrictedUnpickler.allowed:
        import _codecs  # bytes in protocol-2 pickles (numpy scalars); newer torches allow it
        _RestrictedUnpickler.allowed = {**weights_only_globals(), '_codecs.encode': _codecs.encode,
                                        'builtins.bytes': bytes,
                                        **dict(map(_qualified_name, mmengine_safe_globals()))}
    return torch.load(path, map_location=map_location, pickle_module=_RestrictedPickle)
