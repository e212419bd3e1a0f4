"""Put a checkpoint's weights into the model that a config builds, before it is exported.

``--checkpoint`` of the export tools takes:
- a whole detector or segmentor (mmengine's ``state_dict`` with ``backbone.``, ``neck.``,
  ``*_head.`` keys, as ``tools/train.py`` saves it; also a stock mmdet/mmseg Swin model and any
  other whole model whose backbone is in a format ``checkpoint/`` reads): the backbone through
  ``load_pretrained`` (format conversion, bias-table resizing, its key report), every other
  part through mmengine's ``load_state_dict``;
- a backbone alone, in any format ``load_pretrained`` reads: into the backbone; the neck and
  heads then keep their initial weights, so it serves ``--part backbone`` only.

A key missing from a part that is exported is an error (an export with random weights in it
looks right and is not); keys missing elsewhere (a Mask R-CNN's RoI head for ``--part neck``)
and unexpected keys are reported.
"""
from typing import Dict, List

import torch.nn as nn
from mmengine.logging import MMLogger

from ..checkpoint import load_pretrained, read_checkpoint, unwrap

BACKBONE = 'backbone.'


def _listed(keys: List[str], limit: int = 3) -> str:
    more = f' and {len(keys) - limit} more' if len(keys) > limit else ''
    return ', '.join(keys[:limit]) + more


def load_export_weights(model: nn.Module, path: str, exported: List[str],
                        allow_pickle: bool = False) -> str:
    """Load ``path`` into ``model`` (a detector, segmentor or bare backbone); ``exported`` names
    the model's children the export runs (e.g. ['backbone', 'neck']). Returns the report."""
    if not hasattr(model, 'backbone'):  # a bare backbone
        return load_pretrained(model, path, allow_pickle=allow_pickle).summary()
    state, where = unwrap(read_checkpoint(path, allow_pickle))
    whole = any(k.startswith(BACKBONE) for k in state)
    report = load_pretrained(model.backbone, path, allow_pickle=allow_pickle).summary()
    rest = {k: v for k, v in state.items() if not k.startswith(BACKBONE)} if whole else {}
    lines = [f'backbone: {report}']
    missing_used: List[str] = []
    for name, child in model.named_children():
        own = child.state_dict()
        if name == 'backbone' or not own:
            continue
        sub: Dict = {k[len(name) + 1:]: v for k, v in rest.items() if k.startswith(name + '.')}
        missing = [f'{name}.{k}' for k in own if k not in sub]
        for key, value in sub.items():
            if key in own and value.shape != own[key].shape:
                raise ValueError(f'{path}: {name}.{key} has shape {tuple(value.shape)} in the '
                                 f'checkpoint and {tuple(own[key].shape)} in the model built '
                                 'from the config: give the config the checkpoint was trained '
                                 'with')
        if name in exported:
            missing_used += missing
        if sub:
            from mmengine.runner.checkpoint import load_state_dict
            load_state_dict(child, sub, strict=False, logger=MMLogger.get_current_instance())
        lines.append(f'{name}: loaded {len([k for k in sub if k in own])} of {len(own)} '
                     f'tensors' + (f', missing {_listed(missing)}' if missing else ''))
    own_rest = {f'{name}.{k}' for name, child in model.named_children() if name != 'backbone'
                for k in child.state_dict()}
    unexpected = [k for k in rest if k not in own_rest]
    if unexpected:
        lines.append(f'unexpected (not in the model): {_listed(unexpected)}')
    if missing_used:
        held = 'holds a backbone alone' if not whole else f'has no weights for {missing_used[0]}'
        raise ValueError(f'{path} {held} ({len(missing_used)} tensors of the exported parts '
                         'missing): give a whole-model checkpoint saved with this config, or '
                         'export --part backbone')
    return f'weights from {path} ({"whole model" if whole else "backbone"}, {where}):\n  ' + \
        '\n  '.join(lines)
