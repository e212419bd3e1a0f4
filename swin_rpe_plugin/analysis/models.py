"""Models to measure: the published Swin variants (with a classification head) and configs.

The classification model of the Swin paper is backbone -> final norm -> global average pool ->
Linear(num_features[-1], 1000). Our backbone already holds the final norm (``norm3`` when
``out_indices=(3,)``), so :class:`SwinClassifier` only adds the pool and the linear head.
"""
from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from ..models import SwinTransformer, SwinTransformerV2

__all__ = ['ARCHS', 'ARCHS_V2', 'SwinClassifier', 'build_classifier', 'build_from_config',
           'config_inputs']

# The published variants (Liu et al. 2021, Table 1); window 7 at 224x224.
ARCHS: Dict[str, Dict[str, Any]] = {
    'tiny': dict(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)),
    'small': dict(embed_dims=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24)),
    'base': dict(embed_dims=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32)),
    'large': dict(embed_dims=192, depths=(2, 2, 18, 2), num_heads=(6, 12, 24, 48)),
}

# SwinV2 (Liu et al. 2022; official SwinV2 models, window 8 at 256x256).
ARCHS_V2: Dict[str, Dict[str, Any]] = {f'v2-{k}': v for k, v in ARCHS.items() if k != 'large'}


class SwinClassifier(nn.Module):
    """Backbone (last stage out, its norm) -> average pool -> linear head, as in the paper."""

    def __init__(self, backbone: SwinTransformer, num_classes: int = 1000):
        super().__init__()
        self.backbone = backbone
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(backbone.num_features[-1], num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """[B, 3, H, W] -> logits [B, num_classes]."""
        return self.head(self.pool(self.backbone(x)[-1]).flatten(1))


def build_classifier(arch: str, num_classes: int = 1000, **overrides) -> SwinClassifier:
    """The classification model of a published variant (eval mode), backbone args overridable."""
    if arch not in ARCHS and arch not in ARCHS_V2:
        raise KeyError(f'arch {arch!r} is not one of {sorted(ARCHS) + sorted(ARCHS_V2)}')
    v2 = arch in ARCHS_V2
    kwargs = dict((ARCHS_V2 if v2 else ARCHS)[arch], window_size=8 if v2 else 7,
                  drop_path_rate=0.0)
    kwargs.update(overrides)
    kwargs['out_indices'] = (len(kwargs['depths']) - 1,)
    backbone = SwinTransformerV2(**kwargs) if v2 else SwinTransformer(**kwargs)
    return SwinClassifier(backbone, num_classes).eval()


def build_from_config(config, cfg_options: Optional[dict] = None) -> nn.Module:
    """Build the model of an mmdet/mmseg config (no weights loaded, SyncBN made BN, eval mode).

    Args:
        config: a path or an ``mmengine.Config``.
        cfg_options: overrides merged into the config (as ``--cfg-options``).
    """
    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import MODELS, init_default_scope

    cfg = config if isinstance(config, Config) else Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if 'model' not in cfg:
        raise KeyError(f'config {getattr(cfg, "filename", config)!r} has no `model`')
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    backbone = cfg.model.get('backbone', {})
    if isinstance(backbone, dict) and 'init_cfg' in backbone:
        backbone['init_cfg'] = None  # measuring needs no weights; never read a checkpoint here
    model = MODELS.build(cfg.model)
    return revert_sync_batchnorm(model).eval()


def config_inputs(model: nn.Module, hw: Tuple[int, int]) -> Tuple[Tensor, list]:
    """An input batch of one [1, 3, H, W] image and its data samples for ``mode='tensor'``.

    Detectors get a ``DetDataSample`` (the RPN needs image shapes), segmentors a
    ``SegDataSample``; this is what mmdet's and mmseg's get_flops tools pass.
    """
    h, w = hw
    meta = dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w), batch_input_shape=(h, w),
                scale_factor=(1.0, 1.0))
    module = type(model).__module__
    if module.startswith('mmseg'):
        from mmseg.structures import SegDataSample
        sample = SegDataSample(metainfo=meta)
    else:
        from mmdet.structures import DetDataSample
        sample = DetDataSample(metainfo=meta)
    return torch.zeros(1, 3, h, w), [sample]


# Published classification figures (Swin paper, Table 1): M params with head, G FLOPs at 224.
PUBLISHED = {'tiny': (28, 4.5), 'small': (50, 8.7), 'base': (88, 15.4), 'large': (197, 34.5),
             # SwinV2 at 256x256, window 8 (official SwinV2 model zoo)
             'v2-tiny': (28, 5.9), 'v2-small': (50, 11.5), 'v2-base': (88, 20.3)}

# Whole models: published figures (Swin paper Tables 2-3; official Swin detection and
# segmentation repositories), keyed by the config of configs/swin_rpe/ they belong to, with the
# input size they were counted at and this tool's count of the same recipe (our backbone, eval,
# one image; torch 2.13, mmdet 3.3.0, mmseg 1.2.2).
PUBLISHED_CONFIGS = {
    'mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py': ('Mask R-CNN Swin-T', (800, 1280), 48, 267),
    'mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py': ('Mask R-CNN Swin-T', (800, 1280), 48, 267),
    'cascade-mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py': (
        'Cascade Mask R-CNN Swin-T', (800, 1280), 86, 745),
    'upernet_swin-t-p4-w7_8xb2-160k_ade20k-512x512.py': ('UperNet Swin-T', (512, 2048), 60, 945),
}
CASCADE_NOTE = """\
mmdet 3.3's CascadeRoIHead.forward (tensor mode, what get_flops traces) runs each of the 3 mask
heads on all 1000 proposals; the published count (mmdet 2.x forward_dummy) on the first 100. At
0.530 G per RoI and mask head, 2176.2 - 3 x 900 x 0.530 = 745.6 G, the published figure."""
COUNT_NOTE = """\
Not counted by mmengine: RoIAlign, NMS, softmax, GELU, element-wise adds/multiplies; UperNet's
auxiliary head runs only in training (0 G here)."""


def published_for_config(config: str, hw) -> str:
    """The published figures of ``config`` as lines labelled as published, or '' if it has none.

    Only for the recipes they belong to (by file name) and at the size they were counted at; any
    other config or size gets nothing, so a fresh count is never read next to another model's.
    """
    import os.path as osp
    entry = PUBLISHED_CONFIGS.get(osp.basename(str(config)))
    if entry is None:
        return ''
    name, size, params_m, gflops = entry
    if tuple(hw) != size:
        return (f'Published figures of {name} are for {size[0]}x{size[1]}; not shown at '
                f'{hw[0]}x{hw[1]}.')
    lines = [f'Published ({name}, {size[0]}x{size[1]}; Swin paper / official repositories, not '
             f'measured here): {params_m} M params, {gflops} G FLOPs']
    if name.startswith('Cascade'):
        lines.append(CASCADE_NOTE)
    return '\n'.join(lines + [COUNT_NOTE])
