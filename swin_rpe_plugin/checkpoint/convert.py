"""Recognise a checkpoint's key layout and map it to our names with the rules of ``formats``.

Pure functions on dicts of tensors: no file access, no model.
"""
import dataclasses
import re
from typing import Dict, List, Mapping, Optional, Tuple

import torch
from torch import Tensor

from .formats import DERIVED, FORMATS, FORMATS_BY_NAME, INDEX_MAPS, MODEL_PREFIXES, Format

CONTAINERS = ('state_dict', 'model', 'module')
_QKV_PART = re.compile(r'^(?P<key>.+)\[(?P<part>[qkv])\]$')
_FIELD = re.compile(r'\{(?P<name>\w+)(?:\|(?P<fn>\w+))?\}')
_SPLIT = re.compile(r'^(?P<key>.*)<(?P<parts>[^>]+)>$')
_MERGE_REDUCTION = re.compile(r'^stages\.\d+\.downsample\.reduction\.weight$')
_MERGE_NORM = re.compile(r'^stages\.\d+\.downsample\.norm\.(weight|bias)$')


@dataclasses.dataclass
class Conversion:
    """Result of mapping a source state dict to our names."""
    state: Dict[str, Tensor]
    format: str
    container: str                                  # e.g. "['state_dict'], prefix 'backbone.'"
    converted: Dict[str, str] = dataclasses.field(default_factory=dict)  # ours <- source (renamed or re-laid)
    ignored: List[str] = dataclasses.field(default_factory=list)       # not backbone weights
    derived: List[str] = dataclasses.field(default_factory=list)       # index/mask buffers
    unexpected: List[str] = dataclasses.field(default_factory=list)    # no rule matched
    prefix: str = ''                                # whole model: the backbone's key prefix
    outside: Dict[str, Tensor] = dataclasses.field(default_factory=dict)  # whole model: the rest


def unwrap(ckpt: Mapping) -> Tuple[Dict[str, Tensor], str]:
    """Find the state dict inside a checkpoint and drop DDP's ``module.`` prefix.

    Returns (tensors by key, a description of where they were found).
    """
    if not isinstance(ckpt, Mapping):
        raise TypeError(f'checkpoint must be a dict, got {type(ckpt).__name__}')
    where = []
    while True:
        inner = next((c for c in CONTAINERS if isinstance(ckpt.get(c), Mapping)), None)
        if inner is None or any(isinstance(v, Tensor) for v in ckpt.values()):
            break
        where.append(inner)
        ckpt = ckpt[inner]
    state = {k: v for k, v in ckpt.items() if isinstance(v, Tensor)}
    if not state:
        raise KeyError(f'no tensors found in the checkpoint (top-level keys: {list(ckpt)[:10]})')
    if all(k.startswith('module.') for k in state):
        state = {k[len('module.'):]: v for k, v in state.items()}
        where.append('module.')
    return state, '/'.join(where) or 'top level'


def _strip(fmt: Format, key: str) -> str:
    p = fmt.optional_prefix
    return key[len(p):] if p and key.startswith(p) else key


def _matches(fmt: Format, keys: List[str]) -> bool:
    keys = [_strip(fmt, k) for k in keys]
    return (all(any(re.search(p, k) for k in keys) for p in fmt.require)
            and not any(re.search(p, k) for p in fmt.forbid for k in keys))


def detect_format(state: Mapping[str, Tensor], name: Optional[str] = None
                  ) -> Tuple[Format, str]:
    """Return (format, whole-model prefix) of a state dict; ``name`` forces the format.

    Raises KeyError (with example keys) when no format's signature matches.
    """
    if name is not None and name not in FORMATS_BY_NAME:
        raise ValueError(f'format must be one of {sorted(FORMATS_BY_NAME)}, got {name!r}')
    candidates = [FORMATS_BY_NAME[name]] if name else list(FORMATS)
    for prefix in ('',) + tuple(MODEL_PREFIXES):
        keys = [k[len(prefix):] for k in state if k.startswith(prefix)]
        for fmt in candidates:
            if keys and _matches(fmt, keys):
                return fmt, prefix
    raise KeyError(
        'unrecognised Swin checkpoint layout' + (f' for format {name!r}' if name else '') +
        f'; known formats: {", ".join(f.name for f in FORMATS)}. First keys: {list(state)[:6]}')


def _expand(template: str, groups: Dict[str, str]) -> str:
    def field(m: re.Match) -> str:
        value = groups[m.group('name')]
        return str(INDEX_MAPS[m.group('fn')](int(value))) if m.group('fn') else value
    return _FIELD.sub(field, template)


def official_to_unfold(t: Tensor) -> Tensor:
    """Reorder a patch-merging tensor from the official concat order to nn.Unfold's.

    Official: [x(0,0) | x(1,0) | x(0,1) | x(1,1)] blocks of C channels; unfold: per channel c,
    (0,0), (0,1), (1,0), (1,1). Takes [out, 4C] (reduction weight) or [4C] (norm); as mmdet's
    ``swin_converter``.
    """
    c4 = t.shape[-1]
    if c4 % 4:
        raise ValueError(f'patch-merging tensor of shape {tuple(t.shape)}: last dim not 4C')
    blocks = t.reshape(*t.shape[:-1], 4, c4 // 4)[..., [0, 2, 1, 3], :]
    return blocks.transpose(-1, -2).reshape(t.shape).contiguous()


def convert_state_dict(state: Mapping[str, Tensor], fmt: Format, prefix: str = '',
                       container: str = 'top level') -> Conversion:
    """Map ``state`` (source names) to our names with ``fmt``'s rules.

    Keys outside ``prefix`` are ignored; derived buffers are dropped; fused qkv is assembled
    from separate q, k, v; patch-merging tensors are reordered when the format needs it.
    """
    rules = [(re.compile(p), t) for p, t in fmt.rules]
    result = Conversion({}, fmt.name, container + (f", prefix '{prefix}'" if prefix else ''),
                        prefix=prefix)
    parts: Dict[str, Dict[str, Tuple[str, Tensor]]] = {}
    for key, value in state.items():
        if not key.startswith(prefix):
            result.ignored.append(key)
            result.outside[key] = value
            continue
        name = _strip(fmt, key[len(prefix):])
        if any(re.search(p, name) for p in DERIVED):
            result.derived.append(key)
            continue
        match = next(((m, t) for r, t in rules for m in [r.match(name)] if m), None)
        if match is None:
            result.unexpected.append(key)
            continue
        m, template = match
        if template is None:
            result.ignored.append(key)
            continue
        target = _expand(template, m.groupdict())
        split = _SPLIT.match(target)
        if split:
            _put_thirds(result, split.group('key'), split.group('parts').split('|'), key, value)
            continue
        qkv = _QKV_PART.match(target)
        if qkv:
            parts.setdefault(qkv.group('key'), {})[qkv.group('part')] = (key, value)
            continue
        # V1 norms the 4C concatenation (reordered with it); V2 norms the 2C reduction output.
        reorder = fmt.merge_order == 'official' and (
            _MERGE_REDUCTION.match(target) is not None
            or (fmt.arch == 'v1' and _MERGE_NORM.match(target) is not None))
        _put(result, target, key, official_to_unfold(value) if reorder else value,
             changed=reorder or name != target)
    for target, qkv in parts.items():
        if sorted(qkv) != ['k', 'q', 'v']:
            raise KeyError(f'{target}: q, k and v are needed to build the fused qkv tensor, '
                           f'found only {sorted(qkv)} ({[src for src, _ in qkv.values()]})')
        fused = torch.cat([qkv[p][1] for p in 'qkv'], dim=0)
        _put(result, target, ' + '.join(qkv[p][0] for p in 'qkv'), fused, changed=True)
    return result


def _put_thirds(result: Conversion, prefix: str, names: List[str], source: str,
                value: Tensor) -> None:
    """Split a fused tensor into thirds (rows) named prefix + name; '-' drops a third."""
    if len(names) != 3 or value.shape[0] % 3:
        raise KeyError(f'{source}: cannot split a tensor of shape {tuple(value.shape)} into '
                       f'thirds {names}')
    for name, part in zip(names, value.chunk(3, dim=0)):
        if name != '-':
            _put(result, prefix + name, source, part.contiguous(), changed=True)


def _put(result: Conversion, target: str, source: str, value: Tensor, changed: bool) -> None:
    if target in result.state:
        raise KeyError(f'{source} and {result.converted.get(target, target)} both map to '
                       f'{target}: the checkpoint mixes layouts')
    result.state[target] = value
    if changed:
        result.converted[target] = source
