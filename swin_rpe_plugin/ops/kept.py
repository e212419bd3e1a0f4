"""Copies derived from weights (a dtype cast, a gathered bias) kept between forwards.

Inference casts every weight under autocast and gathers every bias table in every forward;
keeping the results saves a pass over the model and a launch per tensor. A kept copy is reused
while its sources are unchanged: the same version counter and storage, and the same
*generation*. The version counter alone is not enough: torch's FSDP gathers shards into the same
buffer without counting a write (FSDP2 preserves the counter on purpose), and ``.data`` writes
skip it, so every ``train()`` / ``eval()`` of a backbone starts a new generation
(:func:`new_generation`), which drops every kept copy: what trains between two evaluations is
never served stale. Within one mode, a weight rewritten without a version bump needs another
``eval()`` (docs/backbone.md).

Imports torch only.
"""
from typing import Callable, Optional, Sequence, Tuple

from torch import Tensor

__all__ = ['KeptCopy', 'new_generation', 'sources_key']

_generation = [0]


def new_generation() -> None:
    """Drop every kept copy (lazily: their keys no longer match)."""
    _generation[0] += 1


def sources_key(tensors: Sequence[Optional[Tensor]], *extra) -> tuple:
    """What a kept copy of ``tensors`` depends on: the generation, each tensor's version and
    storage (None for an absent tensor), and ``extra`` (dtype, device, ...)."""
    return (_generation[0], *extra,
            *(None if t is None else (t._version, t.data_ptr()) for t in tensors))


class KeptCopy:
    """One kept copy: :meth:`get` returns ``make()`` computed anew when ``key`` differs from
    the last call's, else the last result."""

    __slots__ = ('_entry',)

    def __init__(self):
        self._entry: Optional[Tuple[tuple, object]] = None

    def get(self, key: tuple, make: Callable[[], object]):
        entry = self._entry
        if entry is None or entry[0] != key:
            entry = self._entry = (key, make())
        return entry[1]
