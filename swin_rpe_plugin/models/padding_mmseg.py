"""Padding-aware mmseg decode heads: what :func:`enable_padding_aware` does past the backbone.

Imported only when a model has mmseg heads (``import swin_rpe_plugin`` needs no toolkit).

- UperNet (``UPerHead``): the pyramid pooling averages over each image's own region and its
  pooled maps are resized to that region; the top-down path and the fusion resize each image's
  region to its region on the finer level; every conv sees zeros beyond the image (its output is
  zeroed there); the logits are zero beyond the image.
- Every decode head: the logits are cut to each image's region and resized by the head's stride
  on their own (the image's edge is the edge bilinear resizing clamps to) before mmseg crops the
  padding and resizes to the original size. Heads other than UperNet get zeros beyond the image
  in front of each conv, but their own pooling or attention is left as it is.

The head's class becomes a padding-aware drop-in subclass (``PaddingAwareUPerHead`` in our
registry; the same for other decode heads); parameters and state are untouched. Slide inference
(crops) runs the stock path: the backbone does not take sizes that do not fit its input.
"""
from __future__ import annotations

from typing import Dict, List

import torch
from mmseg.models.decode_heads import UPerHead
from mmseg.models.decode_heads.decode_head import BaseDecodeHead
from torch import Tensor, nn

from ..registry import MODELS
from .padding import STATE_ATTR, PaddingState, feature_stride, mask_conv_inputs, \
    padding_state, resize_regions


class PaddingAwareDecodeHeadMixin:
    """Cut the logits to each image before they are resized (see module docstring)."""

    def predict_by_feat(self, seg_logits: Tensor, batch_img_metas: List[dict]) -> Tensor:
        state = padding_state(self)
        # (slide inference's crops never get here active: the backbone refused their sizes)
        if state is None or not state.active or seg_logits.shape[0] != len(state.sizes):
            return super().predict_by_feat(seg_logits, batch_img_metas)
        hw = tuple(seg_logits.shape[-2:])
        s = feature_stride(hw, state.input_hw)
        valid = state.valid(hw)
        scaled = [(h * s, w * s) for h, w in valid]
        out = resize_regions(seg_logits, valid, scaled, (hw[0] * s, hw[1] * s), 'bilinear',
                             self.align_corners)
        return out[..., :state.input_hw[0], :state.input_hw[1]]


class PaddingAwareUPerHeadMixin(PaddingAwareDecodeHeadMixin):
    """UperNet whose pooling, resizing and convs stay within each image."""

    def forward(self, inputs):
        output = super().forward(inputs)
        state = padding_state(self)
        return output if state is None else state.masked(output)

    def _forward_feature(self, inputs):
        state = padding_state(self)
        if state is None or not state.active:
            return super()._forward_feature(inputs)
        inputs = [state.masked(x) for x in self._transform_inputs(inputs)]
        valid = [state.valid(x.shape[-2:]) for x in inputs]
        laterals = [state.masked(conv(inputs[i])) for i, conv in enumerate(self.lateral_convs)]
        laterals.append(self._psp_forward_within(inputs[-1], valid[-1], state))
        n = len(laterals)
        for i in range(n - 1, 0, -1):
            laterals[i - 1] = laterals[i - 1] + resize_regions(
                laterals[i], valid[i], valid[i - 1], laterals[i - 1].shape[2:], 'bilinear',
                self.align_corners)
        fpn_outs = [state.masked(self.fpn_convs[i](laterals[i])) for i in range(n - 1)]
        fpn_outs.append(laterals[-1])
        for i in range(n - 1, 0, -1):
            fpn_outs[i] = resize_regions(fpn_outs[i], valid[i], valid[0], fpn_outs[0].shape[2:],
                                         'bilinear', self.align_corners)
        return state.masked(self.fpn_bottleneck(torch.cat(fpn_outs, dim=1)))

    def _psp_forward_within(self, x: Tensor, valid, state: PaddingState) -> Tensor:
        outs = [x]
        for ppm in self.psp_modules:
            pool, rest = ppm[0], ppm[1:]
            pooled = torch.cat([pool(x[b:b + 1, :, :h, :w]) for b, (h, w) in enumerate(valid)])
            y = rest(pooled)
            outs.append(resize_regions(y, [tuple(y.shape[-2:])] * len(valid), valid,
                                       x.shape[2:], 'bilinear', self.psp_modules.align_corners))
        return state.masked(self.bottleneck(torch.cat(outs, dim=1)))


_CLASSES: Dict[type, type] = {}


def aware_decode_head_class(cls: type) -> type:
    """The padding-aware drop-in subclass of a decode head class (made once per class)."""
    if issubclass(cls, PaddingAwareDecodeHeadMixin):
        return cls
    if cls not in _CLASSES:
        mixin = PaddingAwareUPerHeadMixin if issubclass(cls, UPerHead) else \
            PaddingAwareDecodeHeadMixin
        body = {'__module__': __name__,
                '__doc__': f'{cls.__name__} keeping batch padding out (drop-in; see '
                'swin_rpe_plugin.models.padding_mmseg).'}
        _CLASSES[cls] = type(f'PaddingAware{cls.__name__}', (mixin, cls), body)
    return _CLASSES[cls]


PaddingAwareUPerHead = MODELS.register_module(
    name='PaddingAwareUPerHead', module=aware_decode_head_class(UPerHead))


def make_aware(head: nn.Module, name: str, state: PaddingState) -> List[str]:
    """Make one mmseg head padding-aware in place; return what was done, for the log."""
    if not isinstance(head, BaseDecodeHead):
        mask_conv_inputs(head, state)
        return [f'{type(head).__name__} (convs only)']
    full = isinstance(head, UPerHead)
    if not full:
        mask_conv_inputs(head, state)
    head.__class__ = aware_decode_head_class(type(head))
    setattr(head, STATE_ATTR, state)
    return [type(head).__name__ if full else f'{type(head).__name__} (convs and logits)']
