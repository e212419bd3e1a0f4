"""tools/test.py's ``--batch-size N`` and ``--padding-aware``, and measuring what the test
batch size changes in a model's predictions (docs/padding-aware.md)."""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

from .config import UsageError, load_config, toolkit_of

HOOK = 'swin_rpe_plugin.PaddingAwareHook'


def batch_test_options(config: str, cfg_options: Optional[dict] = None,
                       batch_size: Optional[int] = None,
                       padding_aware: bool = False) -> dict:
    """``cfg_options`` plus what ``--batch-size`` and ``--padding-aware`` set.

    ``--batch-size N``: the test dataloader's batch size; for mmseg the data preprocessor
    becomes ``BatchingSegDataPreprocessor``, which pads test images of different sizes (to a
    multiple of 32 unless its ``test_cfg`` says otherwise), as mmseg's training mode does
    (its test mode refuses a batch of different sizes).
    ``--padding-aware``: ``mask_padding=True`` on the backbone and the ``PaddingAwareHook``
    (the two config lines of docs/padding-aware.md).
    """
    options = dict(cfg_options or {})
    if batch_size is not None and batch_size < 1:
        raise UsageError(f'--batch-size must be >= 1, got {batch_size}')
    if batch_size is None and not padding_aware:
        return options
    cfg = load_config(config, cfg_options)
    if batch_size is not None:
        options['test_dataloader.batch_size'] = batch_size
        if toolkit_of(cfg) == 'mmseg':
            from ..models import seg_preprocessor  # noqa: F401  (registers it)
            options['model.data_preprocessor.type'] = \
                'swin_rpe_plugin.BatchingSegDataPreprocessor'
    if padding_aware:
        hooks = [h for h in cfg.get('custom_hooks', []) if h.get('type') != HOOK]
        options['custom_hooks'] = hooks + [dict(type=HOOK)]
        options['model.backbone.mask_padding'] = True
    return options


# --- measuring what the test batch size changes ---------------------------------------------

def _collect(outputs) -> Dict[str, dict]:
    """The parts of each prediction compared across batch sizes, keyed by image path."""
    found = {}
    for sample in outputs:
        key = sample.metainfo.get('img_path', str(len(found)))
        if 'pred_instances' in sample:
            inst = sample.pred_instances
            found[key] = {k: inst[k].detach().cpu() for k in ('bboxes', 'scores', 'labels',
                                                              'masks') if k in inst}
        if 'seg_logits' in sample:
            found[key] = {'logits': sample.seg_logits.data.detach().cpu()}
    return found


def compare_predictions(ref: Dict[str, dict], other: Dict[str, dict],
                        score_thr: float = 0.05) -> Dict[str, float]:
    """Worst per-image differences of ``other`` against ``ref`` (the same images).

    Detections: each of ``ref``'s detections above ``score_thr`` is paired with the closest
    detection of the same label in ``other`` (max abs box coordinate difference);
    ``box``/``score``: the worst pair's differences; ``masks``: the most mask pixels that
    differ in a pair; ``moved``: detections above ``score_thr`` (of either) without a partner
    within 1 px. Segmentation: ``logits``: the worst logit difference on an image's pixels.
    """
    worst = {}
    for key, a in ref.items():
        b = other[key]
        if 'logits' in a:
            worst['logits'] = max(worst.get('logits', 0.0),
                                  (a['logits'] - b['logits']).abs().max().item())
            continue
        for name in ('box', 'score', 'masks', 'moved'):
            worst.setdefault(name, 0.0)
        keep_a = torch.nonzero(a['scores'] > score_thr).flatten().tolist()
        keep_b = set(torch.nonzero(b['scores'] > score_thr).flatten().tolist())
        for i in keep_a:
            same = torch.nonzero(b['labels'] == a['labels'][i]).flatten()
            if same.numel() == 0:
                worst['moved'] += 1
                worst['box'] = float('inf')
                continue
            dist = (b['bboxes'][same] - a['bboxes'][i]).abs().max(dim=1).values
            j = int(same[dist.argmin()])
            d = dist.min().item()
            worst['box'] = max(worst['box'], d)
            worst['score'] = max(worst['score'], abs(a['scores'][i].item() -
                                                     b['scores'][j].item()))
            if 'masks' in a:
                worst['masks'] = max(worst['masks'],
                                     float((a['masks'][i] != b['masks'][j]).sum()))
            if d > 1.0:
                worst['moved'] += 1
            keep_b.discard(j)
        worst['moved'] += len(keep_b)
    return worst


def measure_batch_sizes(config: str, checkpoint: str, batch_sizes=(1, 2, 4, 8),
                        padding_aware: bool = False, data_root: Optional[str] = None,
                        cfg_options: Optional[dict] = None,
                        work_dir: Optional[str] = None) -> List[dict]:
    """Test ``checkpoint`` at each batch size; per batch size its metrics and the worst
    per-image differences against the first batch size (see :func:`compare_predictions`).
    """
    from mmengine.hooks import Hook
    from .run import build_runner, check_checkpoint_fits, prepare

    class Collect(Hook):
        def __init__(self):
            self.found = {}

        def after_test_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            self.found.update(_collect(outputs))

    rows, ref = [], None
    for n in batch_sizes:
        options = batch_test_options(config, cfg_options, n, padding_aware)
        cfg = prepare(config, work_dir, options, 'none', 'test', data_root)
        cfg.load_from = checkpoint
        runner = build_runner(cfg)
        check_checkpoint_fits(runner.model, checkpoint)
        collect = Collect()
        runner.register_hook(collect, 'LOWEST')
        metrics = {k: float(v) for k, v in runner.test().items()
                   if isinstance(v, (int, float))}
        ref = collect.found if ref is None else ref
        rows.append(dict(batch_size=n, padding_aware=padding_aware, metrics=metrics,
                         worst=compare_predictions(ref, collect.found),
                         images=len(collect.found)))
    return rows
