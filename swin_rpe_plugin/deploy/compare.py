"""How far a runtime's outputs are from eager PyTorch's: max abs diff, relative error, cosine."""
from typing import Callable, Dict, List, Sequence

import numpy as np


def _numpy(t) -> np.ndarray:
    return np.asarray(t.detach().cpu().numpy() if hasattr(t, 'detach') else t)


def max_abs_diffs(got: Sequence[np.ndarray], expected: Sequence) -> List[float]:
    """Per output, the max abs diff (inf where the shapes differ)."""
    if len(got) != len(expected):
        raise RuntimeError(f'{len(got)} outputs, PyTorch gives {len(expected)}')
    diffs = []
    for g, e in zip(got, expected):
        e = _numpy(e)
        diffs.append(float(np.abs(g - e).max()) if g.shape == e.shape else float('inf'))
    return diffs


def agreement(got: Sequence[np.ndarray], expected: Sequence) -> List[Dict[str, float]]:
    """Per output: relative error ||got - ref|| / ||ref|| and cosine similarity, flattened
    (the measures for a reduced precision, where a max abs diff says little)."""
    if len(got) != len(expected):
        raise RuntimeError(f'{len(got)} outputs, PyTorch gives {len(expected)}')
    rows = []
    for g, e in zip(got, expected):
        g, e = np.asarray(g, np.float64).ravel(), _numpy(e).astype(np.float64).ravel()
        if g.shape != e.shape:
            raise RuntimeError(f'output of {g.size} values, PyTorch gives {e.size}')
        norm = np.linalg.norm(e)
        rows.append(dict(rel_error=float(np.linalg.norm(g - e) / norm),
                         cosine=float(g @ e / (np.linalg.norm(g) * norm))))
    return rows


def verify(run: Callable, module, inputs: Sequence) -> List[Dict]:
    """Run each input (torch tensors) through ``run`` and ``module``; per input, the max abs
    diff per output."""
    import torch
    results = []
    for x in inputs:
        with torch.no_grad():
            expected = module(x)
        results.append(dict(shape=list(x.shape),
                            max_abs_diff=max_abs_diffs(run(x.numpy()), expected)))
    return results
