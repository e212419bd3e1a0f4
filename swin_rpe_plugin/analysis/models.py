"""Models to measure: the published Swin variants (with a classification head) and configs.

The classification model of the Swin paper is backbone -> final norm -> global average pool ->
Linear(num_features[-1], 1000). Our backbone already holds the final norm (``norm3`` when
``out_indices=(3,)``), so :class:`SwinClassifier` only adds the pool and the linear head.
"""
from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from ..models import SwinTransformer

__all__ = ['ARCHS', 'SwinClassifier', 'build_classifier', 'build_from_config',
           'config_inputs']

# The published variants (Liu et al. 2021, Table 1); window 7 at 224x224.
ARCHS: Dict[str, Dict[str, Any]] = {
    'tiny': dict(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)),
    'small': dict(embed_dims=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24)),
    'base': dict(embed_dims=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32)),
    'large': dict(embed_dims=192, depths=(2, 2, 18, 2), num_heads=(6, 12, 24, 48)),
}


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
    if arch not in ARCHS:
        raise KeyError(f'arch {arch!r} is not one of {sorted(ARCHS)}')
    kwargs = dict(ARCHS[arch], window_size=7, drop_path_rate=0.0)
    kwargs.update(overrides)
    kwargs['out_indices'] = (len(kwargs['depths']) - 1,)
    return SwinClassifier(SwinTransformer(**kwargs), num_classes).eval()


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
PUBLISHED = {'tiny': (28, 4.5), 'small': (50, 8.7), 'base': (88, 15.4), 'large': (197, 34.5)}

WHOLE_MODEL_NOTE = """\
Published whole-model figures (Swin paper Tables 2-3, official Swin detection/segmentation repos):
  Mask R-CNN Swin-T (1x/3x)     48 M params   267 G FLOPs at 1280x800
  Cascade Mask R-CNN Swin-T     86 M params   745 G FLOPs at 1280x800
  UperNet Swin-T (ADE20K)       60 M params   945 G FLOPs at 512x2048
TODO"""
