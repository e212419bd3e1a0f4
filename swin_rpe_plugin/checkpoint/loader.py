"""Load any supported Swin checkpoint safely into our backbone and report every key.

read (safe) -> unwrap -> detect format -> convert names/layouts -> check values -> resize to
the model's window and grid -> load -> report (logged through mmengine's logger).

Checkpoints are untrusted: pickled files load with ``torch.load(weights_only=True)`` (plus the
data-only allow-list of ``compat`` for mmengine's own checkpoints) unless the caller opts in
with ``allow_pickle=True``; ``.safetensors`` files never execute code.
"""
import dataclasses
import os
import pickle
import re
import zipfile
from typing import Dict, List, Optional, Tuple

import torch
from mmengine.logging import MMLogger, print_log
from torch import Tensor, nn

from .compat import safe_torch_load
from .convert import Conversion, convert_state_dict, detect_format, unwrap
from .formats import FORMATS_BY_NAME
from .resize import POS_EMBED, resize_state_dict

_OUTPUT_NORM = re.compile(r'^norm\d+\.')


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A pickled checkpoint needs code execution (or non-data objects) to load."""


@dataclasses.dataclass
class LoadReport:
    """What happened to each key of a load (names are ours unless stated)."""
    path: str = ''
    format: str = ''
    container: str = ''
    loaded: List[str] = dataclasses.field(default_factory=list)
    converted: Dict[str, str] = dataclasses.field(default_factory=dict)   # ours <- source key
    resized: Dict[str, Tuple[tuple, tuple]] = dataclasses.field(default_factory=dict)
    missing: List[str] = dataclasses.field(default_factory=list)          # model keys not loaded
    unexpected: List[str] = dataclasses.field(default_factory=list)       # source keys unused
    ignored: List[str] = dataclasses.field(default_factory=list)          # not backbone (source)
    derived: List[str] = dataclasses.field(default_factory=list)          # index/mask buffers
    not_in_format: List[str] = dataclasses.field(default_factory=list)    # output norms kept
    zero_tables: List[str] = dataclasses.field(default_factory=list)      # all-zero bias tables
    passed_through: List[str] = dataclasses.field(default_factory=list)   # whole model: the rest
    window_notes: List[str] = dataclasses.field(default_factory=list)     # V2: window transfer

    def summary(self) -> str:
        lines = [f'format {self.format} ({self.container}): loaded {len(self.loaded)}, '
                 f'converted {len(self.converted)}, resized {len(self.resized)}, missing '
                 f'{len(self.missing)}, unexpected {len(self.unexpected)}, ignored '
                 f'{len(self.ignored)} (outside the backbone), derived buffers dropped '
                 f'{len(self.derived)}, output norms not in the checkpoint '
                 f'{len(self.not_in_format)}']
        if self.passed_through:
            lines.append(f'  whole model ({self.container}): backbone converted, '
                         f'{len(self.passed_through)} other keys (necks, heads) passed through '
                         'unchanged')
        lines += [f'  {note}' for note in self.window_notes]
        lines += [f'  resized {k}: {a} -> {b}' for k, (a, b) in self.resized.items()]
        lines += [f'  missing {k}' for k in self.missing]
        lines += [f'  unexpected {k}' for k in self.unexpected]
        lines += [f'  kept at init (no output norms in a {self.format} checkpoint) {k}'
                  for k in self.not_in_format]
        if self.zero_tables:
            lines.append(f'  all-zero relative_position_bias_table: {len(self.zero_tables)} '
                         f'(first: {self.zero_tables[0]}): never initialised or trained '
                         '(mmdet and mmseg leave the tables at zero), so they add no position '
                         'bias')
        return '\n'.join(lines)

    def details(self) -> str:
        """Every key, for the conversion tool's --verbose."""
        lines = [f'  converted {k} <- {v}' for k, v in self.converted.items()]
        lines += [f'  ignored {k}' for k in self.ignored]
        return '\n'.join(lines)


def read_checkpoint(path: str, allow_pickle: bool = False) -> dict:
    """Read a checkpoint file into a dict without executing pickled code (unless allowed).

    Raises FileNotFoundError, UnsafeCheckpointError (code or unknown objects in the pickle,
    naming the ``allow_pickle`` opt-in) or ValueError (truncated or not a checkpoint).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f'checkpoint path must be a str, got {type(path).__name__}')
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f'checkpoint not found: {path!r}')
    if path.endswith('.safetensors'):
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        try:
            return load_file(path, device='cpu')
        except (SafetensorError, OSError) as err:
            raise ValueError(f'{path!r} is not a readable safetensors file (truncated or '
                             f'corrupt?): {err}') from err
    try:
        if allow_pickle:
            return torch.load(path, map_location='cpu', weights_only=False)
        return safe_torch_load(path)
    except pickle.UnpicklingError as err:
        reason = _weights_unpickler_reason(err)
        # torch words a refused global "Unsupported global" or, for modules it blocks outright
        # (os/posix, subprocess, ...), "unsupported GLOBAL ... is blocked": both are code.
        text = str(err).lower()
        unsafe = 'unsupported global' in text or 'is blocked' in text
        if allow_pickle or not unsafe:
            raise ValueError(f'{path!r} is not a readable checkpoint (corrupt, truncated or not '
                             f'a torch file): {reason}') from err
        raise UnsafeCheckpointError(
            f'refused to load {path!r}: its pickle needs objects outside the safe allow-list '
            f'({reason}). Only if you trust this file, pass allow_pickle=True '
            '(init_cfg=dict(..., allow_pickle=True), or --allow-pickle).') from err
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as err:
        raise ValueError(f'{path!r} is not a readable checkpoint (truncated or corrupt?): '
                         f'{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ""}'
                         ) from err


def _weights_unpickler_reason(err: Exception) -> str:
    # torch wraps the actual reason in a long explanation; keep the line that names it
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        if 'WeightsUnpickler error:' in line:
            rest = line.split('WeightsUnpickler error:', 1)[1].strip()
            return rest or (lines[i + 1] if i + 1 < len(lines) else line)
    for line in lines:  # modules torch blocks outright (os, posix, ...) are named on their own line
        if 'unsupported global' in line.lower():
            return line
    return lines[0] if lines else type(err).__name__


def convert_checkpoint(ckpt: dict, format: Optional[str] = None) -> Conversion:
    """Unwrap, detect and convert a loaded checkpoint to our backbone names; check values."""
    state, where = unwrap(ckpt)
    fmt, prefix = detect_format(state, format)
    conversion = convert_state_dict(state, fmt, prefix, where)
    for key, value in conversion.state.items():
        if value.is_floating_point() and not torch.isfinite(value).all():
            bad = int((~torch.isfinite(value)).sum())
            source = conversion.converted.get(key, key)
            raise ValueError(f'{source}: {bad} NaN/Inf values of {value.numel()} in the '
                             'checkpoint; refusing to load it')
    return conversion


def load_pretrained(model: nn.Module, path: str, strict: bool = True,
                    allow_pickle: bool = False, mode: str = 'bicubic',
                    format: Optional[str] = None, src_window=None, src_grid=None
                    ) -> LoadReport:
    """Load a checkpoint of any supported format into ``model`` (a SwinTransformer).

    Bias tables are resized to each attention module's window and an absolute position
    embedding to the model's patch grid (``mode``: 'bicubic' or 'bilinear'). ``format`` forces
    a format name (default: detected); ``src_window``/``src_grid`` give a rectangular source
    window/grid, which cannot be inferred from a table's length.

    Raises KeyError when ``strict`` and a backbone parameter is not in the checkpoint (output
    norms excepted when the checkpoint has none: classification formats do not hold them);
    ValueError naming the key and both shapes when a tensor does not fit.
    """
    conversion = convert_checkpoint(read_checkpoint(path, allow_pickle), format)
    own = model.state_dict()
    _check_arch(model, own, conversion.format, path)

    def window_of(key: str):
        return model.get_submodule(key.rsplit('.', 1)[0]).window_size

    grid = getattr(model, 'pos_embed_grid', None)
    state, resized = resize_state_dict(conversion.state, window_of, grid if POS_EMBED in own
                                       else None, src_window, src_grid, mode)
    state = {k: v for k, v in state.items() if k in own}
    for key, value in state.items():
        if value.shape != own[key].shape:
            raise ValueError(f'{key} (checkpoint {conversion.converted.get(key, key)}): '
                             f'checkpoint shape {tuple(conversion.state[key].shape)} does not '
                             f'fit the model shape {tuple(own[key].shape)}')
    model.load_state_dict(state, strict=False)
    report = LoadReport(path=str(path), format=conversion.format, container=conversion.container,
                        loaded=list(state), converted=conversion.converted, resized=resized,
                        ignored=conversion.ignored, derived=conversion.derived,
                        unexpected=conversion.unexpected + [k for k in conversion.state
                                                            if k not in own])
    report.zero_tables = [k for k, v in state.items()
                          if k.endswith('relative_position_bias_table') and not v.any()]
    missing = [k for k in own if k not in state]
    has_norms = any(_OUTPUT_NORM.match(k) for k in conversion.state)
    report.not_in_format = [k for k in missing if _OUTPUT_NORM.match(k) and not has_norms]
    report.missing = [k for k in missing if k not in report.not_in_format]
    if hasattr(model, 'window_transfer_notes'):
        report.window_notes = model.window_transfer_notes()
    print_log(f'load_pretrained({path!r}): {report.summary()}',
              logger=MMLogger.get_current_instance())
    if strict and report.missing:
        raise KeyError(f'{len(report.missing)} backbone parameters missing from {path!r} '
                       f'(format {report.format}): {report.missing[:10]}; pass strict=False '
                       'to load anyway')
    return report


def _check_arch(model: nn.Module, own: Dict[str, Tensor], format: str, path: str) -> None:
    """Refuse V1 weights in a V2 model and the reverse (their keys barely overlap)."""
    model_arch = 'v2' if any('.cpb_mlp.' in k for k in own) else 'v1'
    arch = FORMATS_BY_NAME[format].arch
    if arch != model_arch:
        wanted = 'SwinTransformerV2' if arch == 'v2' else 'SwinTransformer'
        raise ValueError(f'{path!r} holds Swin {arch.upper()} weights (format {format}) but '
                         f'{type(model).__name__} is a Swin {model_arch.upper()} backbone: build '
                         f"type='swin_rpe_plugin.{wanted}' to load it")


def convert_file(src: str, dst: str, window=None, img_size=None, mode: str = 'bicubic',
                 allow_pickle: bool = False, format: Optional[str] = None, src_window=None,
                 src_grid=None, log: bool = True, backbone_only: bool = False) -> LoadReport:
    """Convert a checkpoint file to our backbone names, optionally resized; write ``dst``.

    ``window`` resizes every bias table; ``img_size`` (int or (h, w)) resizes an absolute
    position embedding to img_size / patch size. A whole detector, segmentor or classifier
    (backbone under a prefix such as ``backbone.``) stays whole: its backbone is converted and
    resized under the same prefix and every other key is passed through unchanged (listed as
    ``passed_through``), unless ``backbone_only``. ``dst`` ending in ``.safetensors`` is written
    with safetensors, anything else with ``torch.save`` as ``{'state_dict': ...}``.
    """
    conversion = convert_checkpoint(read_checkpoint(src, allow_pickle), format)
    grid = None
    if img_size is not None:
        proj = conversion.state.get('patch_embed.projection.weight')
        if proj is None:
            raise KeyError('patch_embed.projection.weight is needed to turn img_size into a '
                           'patch grid and is not in the checkpoint')
        size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        grid = (size[0] // proj.shape[-2], size[1] // proj.shape[-1])
    state, resized = resize_state_dict(conversion.state, window, grid, src_window, src_grid,
                                       mode)
    whole = bool(conversion.prefix) and not backbone_only
    if whole:
        prefix = conversion.prefix
        state = {**{prefix + k: v for k, v in state.items()}, **conversion.outside}
        resized = {prefix + k: v for k, v in resized.items()}
    state = {k: v.contiguous() for k, v in state.items()}
    if dst.endswith('.safetensors'):
        from safetensors.torch import save_file
        save_file(state, dst, metadata={'format': 'pt', 'source_format': conversion.format})
    else:
        torch.save({'state_dict': state}, dst)
    report = LoadReport(path=src, format=conversion.format, container=conversion.container,
                        loaded=list(state), converted=conversion.converted, resized=resized,
                        ignored=[] if whole else conversion.ignored,
                        derived=conversion.derived, unexpected=conversion.unexpected,
                        passed_through=list(conversion.outside) if whole else [],
                        zero_tables=[k for k, v in state.items()
                                     if k.endswith('relative_position_bias_table')
                                     and not v.any()])
    if log:
        print_log(f'convert_file({src!r} -> {dst!r}): {report.summary()}',
                  logger=MMLogger.get_current_instance())
    return report
