"""What the padding-aware option costs: Mask R-CNN inference with it on against off.

The model is ``configs/swin_rpe/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py`` with random weights
(seeded; every side loads the same state dict), one synthetic image of 800 x 1199 (the
preprocessor pads it to 800 x 1216, a multiple of 32), fp32, ``mode='predict'`` under no_grad.
Steps, timed alternately in one process (``runner.time_interleaved``):

- ``off``: the stock model (``mask_padding=False``, nothing hooked);
- ``mask_padding``: ``mask_padding=True`` alone (the backbone's window padding masked);
- ``on``: ``mask_padding=True`` and ``enable_padding_aware`` (docs/padding-aware.md).

The record's ``on_off`` is on ms / off ms (the issue's target: at most 1.03); ``ms_by_part`` the
median of each part of a step over the timed rounds: backbone, neck (with its masking hooks),
rpn (``rpn_head.predict``: convs, top-k, NMS), roi (``roi_head.predict``: boxes and masks)
and rest (what the detector does around them).
"""
import os
import statistics
import time
from typing import Dict, List, Tuple

import torch

from swin_rpe_plugin import enable_padding_aware
from .detector import detector_step, synthetic_batch
from .runner import Comparison

__all__ = ['CONFIG', 'DEFAULT_CASE', 'PARTS', 'PartTimes', 'build_mask_rcnn',
           'padding_aware_comparison', 'format_padding_aware']

CONFIG = 'configs/swin_rpe/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'
DEFAULT_CASE = ((800, 1199), 1)  # COCO's test scale for a 4:3 image that is not padded to 32
PARTS = ('backbone', 'neck', 'rpn', 'roi', 'rest')


def build_mask_rcnn(mask_padding: bool, state_dict=None) -> torch.nn.Module:
    """Our Swin-T Mask R-CNN, seeded random weights (or ``state_dict``), in eval mode."""
    from mmengine.config import Config
    from mmengine.registry import MODELS, init_default_scope
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = Config.fromfile(os.path.join(root, CONFIG))
    cfg.model.backbone.update(init_cfg=None, mask_padding=mask_padding)
    init_default_scope('mmdet')
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    if state_dict is not None:
        model.load_state_dict(state_dict, strict=True)
    return model.eval()


class PartTimes:
    """Milliseconds of each part (:data:`PARTS`) of every predict step of one model.

    Hooks on the backbone's and neck's forward (registered after ``enable_padding_aware``'s,
    so the neck's time includes its output masking) and the heads' ``predict`` wrapped on the
    instance; ``rest`` is the step's time less the parts.
    """

    def __init__(self, model: torch.nn.Module):
        self.calls: List[Dict[str, float]] = []
        self._now: Dict[str, float] = {}
        self._start: Dict[str, float] = {}
        for name in ('backbone', 'neck'):
            module = getattr(model, name)
            module.register_forward_pre_hook(lambda *_, n=name: self._begin(n))
            module.register_forward_hook(lambda *_, n=name: self._end(n))
        for name, part in (('rpn_head', 'rpn'), ('roi_head', 'roi')):
            head = getattr(model, name)
            head.predict = self._timed(part, head.predict)

    def _begin(self, part: str) -> None:
        self._start[part] = time.perf_counter()

    def _end(self, part: str) -> None:
        self._now[part] = self._now.get(part, 0.0) + \
            (time.perf_counter() - self._start.pop(part)) * 1e3

    def _timed(self, part, fn):
        def timed(*args, **kwargs):
            self._begin(part)
            try:
                return fn(*args, **kwargs)
            finally:
                self._end(part)
        return timed

    def step(self, run):
        """``run`` (a predict step) recording its parts."""
        def step(data):
            self._now = {}
            t0 = time.perf_counter()
            out = run(data)
            total = (time.perf_counter() - t0) * 1e3
            self._now['rest'] = total - sum(self._now.values())
            self.calls.append(self._now)
            return out
        return step

    def medians(self, last: int) -> Dict[str, float]:
        """Median ms of each part over the last ``last`` calls (the timed rounds)."""
        calls = self.calls[-last:]
        return {p: statistics.median(c.get(p, 0.0) for c in calls) for p in PARTS}


def padding_aware_comparison(shape: Tuple[int, int] = DEFAULT_CASE[0], batch: int = 1,
                             dtype: str = 'fp32') -> Comparison:
    """The Mask R-CNN predict step with the option off, ``mask_padding`` alone, and on.

    ``Comparison.finish(record, repeats)`` (called by ``run_comparison``) adds ``on_off`` and
    ``ms_by_part`` to the record.
    """
    if dtype != 'fp32':
        raise ValueError(f'the padding-aware case runs in fp32, not {dtype!r}')
    off = build_mask_rcnn(False)
    state = off.state_dict()
    models = {'off': off, 'mask_padding': build_mask_rcnn(True, state),
              'on': enable_padding_aware(build_mask_rcnn(True, state))}
    data = synthetic_batch(off, tuple(shape), False, batch)
    parts = {name: PartTimes(model) for name, model in models.items()}
    steps = {name: parts[name].step(detector_step(model, 'infer'))
             for name, model in models.items()}

    def finish(record: dict, repeats: int) -> None:
        record['on_off'] = record['on_ms'] / record['off_ms']
        record['ms_by_part'] = {name: p.medians(repeats) for name, p in parts.items()}

    key = dict(kind='padding-aware', arch='mask-rcnn', shape=list(shape), batch=batch,
               mode='infer', dtype=dtype, padded_shape=list(data['inputs'].shape[-2:]))
    return Comparison(key, steps, data, baseline='off', candidate='on', finish=finish)


def format_padding_aware(record: dict) -> str:
    """The on/off ratio and the parts of each step, for the console."""
    lines = [f"padding-aware {'x'.join(map(str, record['shape']))} (padded to "
             f"{'x'.join(map(str, record['padded_shape']))}) b{record['batch']}: on/off "
             f"{record['on_off']:.3f} (target <= 1.03); ms per part, median:"]
    lines.append(f"  {'':>12}" + ''.join(f' {p:>9}' for p in ('step',) + PARTS))
    for name, parts in record['ms_by_part'].items():
        lines.append(f"  {name:>12} {record[name + '_ms']:9.0f}" +
                     ''.join(f' {parts[p]:9.0f}' for p in PARTS))
    return '\n'.join(lines)
