"""Pass each image's unpadded size from mmdet/mmseg data samples to our backbone.

Detectors and segmentors call ``self.backbone(batch_inputs)`` without the data samples, which
carry every image's ``img_shape`` (its size before batch padding). Rather than subclass every
detector and segmentor, a forward pre-hook on the whole model reads the sizes from the
``data_samples`` it is called with, and a pre-hook on the backbone hands them over as
``valid_sizes`` for that one call; the model's forward hook clears them. Turned on from a config
by one hook (``custom_hooks = [dict(type='swin_rpe_plugin.PaddingAwareHook')]``), or in code by
:func:`enable_padding_aware`.

The sizes are used only when the backbone's input matches them: same batch size and every size
within the input (slide inference feeds crops whose samples describe the whole image; those
crops run without them).
"""
from typing import List, Optional, Sequence, Tuple

from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from torch import nn

from ..registry import HOOKS

_ATTR = '_swin_rpe_padding_aware'


def valid_sizes_from_samples(data_samples: Optional[Sequence]) -> Optional[List[Tuple[int, int]]]:
    """(h, w) of each image before batch padding, from the samples' ``img_shape``."""
    if not data_samples:
        return None
    sizes = []
    for sample in data_samples:
        shape = getattr(sample, 'metainfo', {}).get('img_shape')
        if shape is None:
            return None
        sizes.append((int(shape[0]), int(shape[1])))
    return sizes


def enable_padding_aware(model: nn.Module) -> nn.Module:
    """Make a detector/segmentor with our backbone pass its images' sizes to the backbone.

    Idempotent. The backbone should be built with ``mask_padding=True`` (its own padding is
    then masked too); raises TypeError when the model has no ``SwinTransformer`` of ours as
    ``backbone``.
    """
    from .swin import SwinTransformer
    inner = model.module if is_model_wrapper(model) else model
    backbone = getattr(inner, 'backbone', None)
    if not isinstance(backbone, SwinTransformer):
        raise TypeError('enable_padding_aware needs a model whose backbone is '
                        f'swin_rpe_plugin.SwinTransformer, got {type(backbone).__name__}')
    if getattr(inner, _ATTR, False):
        return model
    pending = {}

    def model_pre_hook(module, args, kwargs):
        samples = kwargs.get('data_samples', args[1] if len(args) > 1 else None)
        pending['sizes'] = valid_sizes_from_samples(samples)

    def model_post_hook(module, args, output):
        pending.clear()

    def backbone_pre_hook(module, args, kwargs):
        sizes = pending.get('sizes')
        if sizes is None or kwargs.get('valid_sizes') is not None or not args:
            return None
        x = args[0]
        if x.shape[0] != len(sizes) or any(h > x.shape[2] or w > x.shape[3] for h, w in sizes):
            return None
        return args, {**kwargs, 'valid_sizes': sizes}

    inner.register_forward_pre_hook(model_pre_hook, with_kwargs=True)
    inner.register_forward_hook(model_post_hook, always_call=True)
    backbone.register_forward_pre_hook(backbone_pre_hook, with_kwargs=True)
    setattr(inner, _ATTR, True)
    if not backbone.mask_padding:
        print_log('padding-aware: the backbone has mask_padding=False; its own window padding '
                  'still takes part in attention', logger='current')
    return model


@HOOKS.register_module()
class PaddingAwareHook(Hook):
    """Turn on :func:`enable_padding_aware` for the runner's model before it runs."""

    def before_run(self, runner) -> None:
        enable_padding_aware(runner.model)
        print_log('padding-aware: backbone features ignore batch padding (valid sizes from '
                  'img_shape)', logger='current')
