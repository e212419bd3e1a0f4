"""Padding-aware mmdet heads: what :func:`enable_padding_aware` does past the neck.

Imported only when a model has mmdet heads (``import swin_rpe_plugin`` needs no toolkit).

- Dense heads (RPN, RetinaNet and any ``BaseDenseHead`` predicting per image through
  ``_predict_by_feat_single``): their convolutions see zeros beyond each image, and each image
  predicts from the positions of its own region on every level only (its scores, box deltas and
  priors are cut to ``ceil(h / stride)`` x ``ceil(w / stride)`` before top-k and NMS), so no
  proposal or detection comes from a padded position and the candidates are the same, in the
  same order, at any padding. The head's class becomes a padding-aware drop-in subclass
  (``PaddingAwareRPNHead``, ``PaddingAwareRetinaHead`` in our registry, and the same for other
  dense heads); its parameters and state are untouched.
- RoI heads (Mask R-CNN, Cascade): a pre-hook on every RoI extractor copies each image's last
  valid row and column of the feature maps one step outwards, so RoIAlign near an image's
  bottom/right edge reads the edge value, as mmcv's RoIAlign does at the end of a map. Boxes and
  masks are then decoded and pasted per image, as the toolkit does anyway.
"""
from __future__ import annotations

import inspect
from typing import Dict, List

import torch
from mmdet.models.dense_heads import RetinaHead, RPNHead
from mmdet.models.dense_heads.base_dense_head import BaseDenseHead
from mmdet.models.roi_heads.roi_extractors import BaseRoIExtractor
from torch import nn

from ..registry import MODELS
from .padding import STATE_ATTR, PaddingState, mask_conv_inputs, padding_state, \
    run_convs_per_image, valid_sizes_at


def _crop_priors(priors, hw, valid):
    """Priors of the top-left ``valid`` positions of an [H*W*A] grid, in the grid's order."""
    (hh, ww), (h, w) = hw, valid
    per = priors.shape[0] // (hh * ww)
    rows = torch.arange(h, device=priors.device)
    cols = torch.arange(w, device=priors.device)
    pos = (rows[:, None] * ww + cols[None, :]).reshape(-1)
    index = (pos[:, None] * per + torch.arange(per, device=priors.device)[None, :]).reshape(-1)
    return priors[index]


class PaddingAwareDenseHeadMixin:
    """Predict each image from the positions of its own region only (see module docstring)."""

    def _predict_by_feat_single(self, cls_score_list, bbox_pred_list, score_factor_list,
                                mlvl_priors, img_meta, *args, **kwargs):
        state = padding_state(self)
        if state is not None and state.active and 'img_shape' in img_meta:
            size = [tuple(int(v) for v in img_meta['img_shape'][:2])]
            crops = []
            for level, score in enumerate(cls_score_list):
                hw = tuple(score.shape[-2:])
                (h, w), = valid_sizes_at(size, hw, state.input_hw)
                crops.append((hw, (h, w)))
            if any(hw != v for hw, v in crops):
                cls_score_list = [s[:, :v[0], :v[1]] for s, (_, v) in zip(cls_score_list, crops)]
                bbox_pred_list = [b[:, :v[0], :v[1]] for b, (_, v) in zip(bbox_pred_list, crops)]
                score_factor_list = [f if f is None else f[:, :v[0], :v[1]]
                                     for f, (_, v) in zip(score_factor_list, crops)]
                mlvl_priors = [_crop_priors(p, hw, v) for p, (hw, v) in zip(mlvl_priors, crops)]
        return super()._predict_by_feat_single(cls_score_list, bbox_pred_list,
                                               score_factor_list, mlvl_priors, img_meta,
                                               *args, **kwargs)


_CLASSES: Dict[type, type] = {}


def aware_dense_head_class(cls: type) -> type:
    """The padding-aware drop-in subclass of a dense head class (made once per class)."""
    if issubclass(cls, PaddingAwareDenseHeadMixin):
        return cls
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f'PaddingAware{cls.__name__}', (PaddingAwareDenseHeadMixin, cls),
                             {'__module__': __name__,
                              '__doc__': f'{cls.__name__} predicting from each image\'s own '
                              'positions only (drop-in; see swin_rpe_plugin.models.padding_mmdet).'})
    return _CLASSES[cls]


PaddingAwareRPNHead = MODELS.register_module(
    name='PaddingAwareRPNHead', module=aware_dense_head_class(RPNHead))
PaddingAwareRetinaHead = MODELS.register_module(
    name='PaddingAwareRetinaHead', module=aware_dense_head_class(RetinaHead))


def _replicated_feats_hook(state: PaddingState):
    def hook(module, args):
        if not state.active or not args or not isinstance(args[0], (list, tuple)):
            return None
        feats = tuple(state.edges_replicated(f) for f in args[0])
        return (feats,) + tuple(args[1:])
    return hook


def _predicts_per_position(head: nn.Module) -> bool:
    """Whether the head predicts through the per-level grid ``_predict_by_feat_single``."""
    params = inspect.signature(type(head)._predict_by_feat_single).parameters
    return all(p in params for p in ('cls_score_list', 'bbox_pred_list', 'mlvl_priors'))


def make_aware(head: nn.Module, name: str, state: PaddingState) -> List[str]:
    """Make one mmdet head padding-aware in place; return what was done, for the log."""
    if isinstance(head, BaseDenseHead) and _predicts_per_position(head):
        mask_conv_inputs(head, state)
        run_convs_per_image(head, state)
        head.__class__ = aware_dense_head_class(type(head))
        setattr(head, STATE_ATTR, state)
        return [type(head).__name__]
    extractors = [m for m in head.modules() if isinstance(m, BaseRoIExtractor)]
    for m in extractors:
        m.register_forward_pre_hook(_replicated_feats_hook(state))
    if extractors:
        return [f'{type(head).__name__} ({len(extractors)} RoI extractors)']
    if name == 'roi_head':  # convs on RoIs, not on the image: nothing to mask
        return [f'{type(head).__name__} (unchanged)']
    mask_conv_inputs(head, state)
    return [f'{type(head).__name__} (convs only)']
