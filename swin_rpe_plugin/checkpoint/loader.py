"""Load a backbone checkpoint safely, resize what needs resizing, and report every key.

Checkpoints are untrusted: pickled files load with ``torch.load(weights_only=True)`` unless the
caller opts in with ``allow_pickle=True``; ``.safetensors`` files never execute code.
"""
import dataclasses
import os
from typing import Dict, List, Tuple

import torch
from mmengine.logging import MMLogger, print_log
from torch import Tensor, nn

from ..ops import resize_relative_position_bias_table, to_window_tuple

BIAS_TABLE = 'relative_position_bias_table'
DERIVED_BUFFERS = ('relative_position_index', 'attn_mask')


@dataclasses.dataclass
class LoadReport:
    """What happened to each key of a load."""
    loaded: List[str] = dataclasses.field(default_factory=list)
    resized: Dict[str, Tuple[tuple, tuple]] = dataclasses.field(default_factory=dict)
    missing: List[str] = dataclasses.field(default_factory=list)
    unexpected: List[str] = dataclasses.field(default_factory=list)
    ignored: List[str] = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        lines = [f'loaded {len(self.loaded)}, resized {len(self.resized)}, missing '
                 f'{len(self.missing)}, unexpected {len(self.unexpected)}, ignored (derived or '
                 f'outside the backbone) {len(self.ignored)}']
        lines += [f'  resized {k}: {tuple(a)} -> {tuple(b)}' for k, (a, b) in self.resized.items()]
        lines += [f'  missing {k}' for k in self.missing]
        lines += [f'  unexpected {k}' for k in self.unexpected]
        return '\n'.join(lines)


def read_checkpoint(path: str, allow_pickle: bool = False) -> dict:
    """Read a checkpoint file into a dict without executing pickled code (unless allowed)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f'checkpoint not found: {path!r}')
    if path.endswith('.safetensors'):
        from safetensors.torch import load_file
        return load_file(path, device='cpu')
    try:
        return torch.load(path, map_location='cpu', weights_only=not allow_pickle)
    except Exception as err:  # weights_only refuses code-carrying or unknown pickled objects
        if allow_pickle:
            raise
        raise RuntimeError(
            f'refused to unpickle {path!r} safely ({type(err).__name__}: {err}). If you trust '
            'this file, pass allow_pickle=True (init_cfg=dict(..., allow_pickle=True)).') from err


def backbone_state_dict(ckpt: dict) -> Tuple[Dict[str, Tensor], List[str]]:
    """Unwrap a checkpoint to backbone keys; return (state dict, keys left out)."""
    for wrapper in ('state_dict', 'model', 'module'):
        if isinstance(ckpt.get(wrapper), dict):
            ckpt = ckpt[wrapper]
            break
    state = {k[len('module.'):] if k.startswith('module.') else k: v for k, v in ckpt.items()
             if isinstance(v, Tensor)}
    ignored = [k for k, v in ckpt.items() if not isinstance(v, Tensor)]
    if any(k.startswith('backbone.') for k in state):
        ignored += [k for k in state if not k.startswith('backbone.')]
        state = {k[len('backbone.'):]: v for k, v in state.items() if k.startswith('backbone.')}
    ignored += [k for k in state if k.rsplit('.', 1)[-1] in DERIVED_BUFFERS]
    state = {k: v for k, v in state.items() if k.rsplit('.', 1)[-1] not in DERIVED_BUFFERS}
    return state, ignored


def _square_window(rows: int, key: str) -> Tuple[int, int]:
    side = round(rows ** 0.5)
    if side * side != rows or side % 2 == 0:
        raise ValueError(f'{key}: cannot infer the window of a table with {rows} rows')
    return ((side + 1) // 2, (side + 1) // 2)


def load_pretrained(model: nn.Module, path: str, strict: bool = False,
                    allow_pickle: bool = False, mode: str = 'bicubic') -> LoadReport:
    """Load a checkpoint into ``model`` (a SwinTransformer), resizing bias tables.

    Raises KeyError when ``strict`` and a model parameter is missing from the checkpoint.
    """
    state, ignored = backbone_state_dict(read_checkpoint(path, allow_pickle))
    own = model.state_dict()
    report = LoadReport(ignored=ignored)
    for key, value in list(state.items()):
        if key not in own or own[key].shape == value.shape:
            continue
        if key.endswith(BIAS_TABLE) and own[key].shape[1] == value.shape[1]:
            window = model.get_submodule(key.rsplit('.', 1)[0]).window_size
            state[key] = resize_relative_position_bias_table(
                value, _square_window(value.shape[0], key), to_window_tuple(window), mode)
            report.resized[key] = (tuple(value.shape), tuple(own[key].shape))
        else:
            raise ValueError(f'{key}: checkpoint shape {tuple(value.shape)} does not fit the '
                             f'model shape {tuple(own[key].shape)}')
    result = model.load_state_dict(state, strict=False)
    report.missing, report.unexpected = list(result.missing_keys), list(result.unexpected_keys)
    report.loaded = [k for k in state if k in own]
    logger = MMLogger.get_current_instance()
    print_log(f'load_pretrained({path!r}): {report.summary()}', logger=logger)
    if strict and report.missing:
        raise KeyError(f'{len(report.missing)} backbone keys missing from {path!r}: '
                       f'{report.missing[:10]}')
    return report
