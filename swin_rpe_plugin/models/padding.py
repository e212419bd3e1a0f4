"""Keep batch padding out of a whole mmdet/mmseg model that has our backbone.

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

Past the backbone the same sizes reach the neck and the heads (see ``docs/padding-aware.md``):
every convolution of the neck and of the dense / decode heads sees zeros beyond each image (a
pre-hook on the conv); at inference the neck's and dense heads' plain convs run on each image's
own region (:class:`PerImageConv2d`), so their sums have the same shapes alone and batched; the
neck's outputs are zero beyond the images, and the toolkit modules whose
arithmetic itself reads across the border get a padding-aware drop-in class
(``padding_mmdet.py``: dense heads predict from the image's own positions only, RoI extractors
read the image's edge as the map's edge; ``padding_mmseg.py``: UperNet). A feature map's valid
region is ``ceil(h / s)`` x ``ceil(w / s)`` for an image of h x w pixels, where s is the map's
stride, the power of two that turns the batch's input size into the map's size (as the
backbone's nested ceilings do).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from torch import Tensor, nn

from ..ops.masks import region_mask
from ..registry import HOOKS

_ATTR = '_swin_rpe_padding_aware'
STATE_ATTR = '_swin_rpe_padding_state'
Size = Tuple[int, int]


# --- pure tensor functions ----------------------------------------------------------------

def feature_stride(map_hw: Sequence[int], input_hw: Sequence[int]) -> int:
    """The power of two s with ``ceil(input / s) == map`` in both dimensions (the smallest).

    Raises ValueError when there is none (the map is not a strided view of the input).
    """
    hp, wp = int(input_hw[0]), int(input_hw[1])
    hf, wf = int(map_hw[0]), int(map_hw[1])
    s = 1
    while s <= 2 * max(hp, wp):
        if -(-hp // s) == hf and -(-wp // s) == wf:
            return s
        s *= 2
    raise ValueError(f'a feature map of {hf}x{wf} is not a power-of-two stride of the input '
                     f'{hp}x{wp}; padding-aware modules need maps of size ceil(input / 2**k)')


def valid_sizes_at(sizes: Sequence[Size], map_hw: Sequence[int],
                   input_hw: Sequence[int]) -> Tuple[Size, ...]:
    """Each image's (h, w) region on a feature map: ``ceil(h / s)``, s its stride."""
    s = feature_stride(map_hw, input_hw)
    return tuple((-(-int(h) // s), -(-int(w) // s)) for h, w in sizes)


def resize_regions(x: Tensor, valid: Sequence[Size], out_valid: Sequence[Size],
                   out_hw: Sequence[int], mode: str = 'bilinear',
                   align_corners: Optional[bool] = False) -> Tensor:
    """Resize each image's region alone: [B, C, H, W] -> [B, C, *out_hw], zeros outside.

    Image b's top-left ``valid[b]`` region is resized to ``out_valid[b]`` and written at the
    top-left of its output, so nothing beyond an image's border takes part (the image's own
    edge is the edge the interpolation clamps to, as if it had been run alone and unpadded).
    """
    out = x.new_zeros(x.shape[0], x.shape[1], int(out_hw[0]), int(out_hw[1]))
    kwargs = {} if mode in ('nearest', 'area') else {'align_corners': align_corners}
    for b, ((h, w), (oh, ow)) in enumerate(zip(valid, out_valid)):
        region = x[b:b + 1, :, :h, :w]
        if (h, w) != (oh, ow):
            region = nn.functional.interpolate(region, size=(oh, ow), mode=mode, **kwargs)
        out[b:b + 1, :, :oh, :ow] = region
    return out


def replicate_edges(x: Tensor, valid: Sequence[Size], in_place: bool = False) -> Tensor:
    """Copy each image's last valid row and column one step outwards (where there is room).

    Bilinear sampling next to an image's bottom/right edge then reads the edge value, as it
    does when the map ends there (mmcv's RoIAlign clamps to the last row/column). A copy
    unless ``in_place``.
    """
    hh, ww = x.shape[-2:]
    if all(h >= hh and w >= ww for h, w in valid):
        return x
    if not in_place:
        x = x.clone()
    for b, (h, w) in enumerate(valid):
        if h < hh:
            x[b, :, h, :w] = x[b, :, h - 1, :w]
        if w < ww:
            x[b, :, :h, w] = x[b, :, :h, w - 1]
        if h < hh and w < ww:
            x[b, :, h, w] = x[b, :, h - 1, w - 1]
    return x


def zero_beyond_(x: Tensor, valid: Sequence[Size]) -> Tensor:
    """Zero ``x`` [B, C, H, W] beyond each image's top-left (h, w) region, in place.

    Writes the padded rows and columns only (nothing when an image fills the map), so it costs
    what the padding holds, not what the map does. Returns ``x``.
    """
    hh, ww = x.shape[-2:]
    for b, (h, w) in enumerate(valid):
        if h < hh:
            x[b, :, h:].zero_()
        if w < ww:
            x[b, :, :h, w:].zero_()
    return x


def valid_sizes_from_samples(data_samples: Optional[Sequence]) -> Optional[List[Size]]:
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


# --- the state one model's hooks share ----------------------------------------------------

class PaddingState:
    """The sizes of the batch in flight: set by the model's and backbone's pre-hooks.

    ``input_hw`` is set only when the backbone took the sizes (the input fits them); the neck
    and heads act only then. Regions and masks are cached per map size for the call.

    Without autograd (inference) a map is zeroed beyond the images in place, padded rows and
    columns only (:func:`zero_beyond_`): no new tensor, and the cost of the padding, not of the
    map. With autograd on, a copy is multiplied by the [B, 1, H, W] mask, so no tensor autograd
    kept is changed. Both give the same values: the map inside, zeros beyond.
    """

    def __init__(self) -> None:
        self.sizes: Optional[List[Size]] = None
        self.input_hw: Optional[Size] = None
        self._valid: Dict[tuple, Tuple[Size, ...]] = {}
        self._masks: Dict[tuple, Optional[Tensor]] = {}
        self._edges: Dict[int, Tuple[Tensor, Tensor]] = {}
        self._clean: Dict[int, Tensor] = {}  # maps known to be zero beyond every image

    @property
    def active(self) -> bool:
        return self.input_hw is not None and self.sizes is not None

    def reset(self) -> None:
        self.sizes, self.input_hw = None, None
        self._valid.clear()
        self._masks.clear()
        self._edges.clear()
        self._clean.clear()

    def valid(self, map_hw: Sequence[int]) -> Tuple[Size, ...]:
        key = (int(map_hw[0]), int(map_hw[1]))
        if key not in self._valid:
            self._valid[key] = valid_sizes_at(self.sizes, key, self.input_hw)
        return self._valid[key]

    def padded(self, x: Tensor) -> Optional[Tuple[Size, ...]]:
        """Each image's region on a map like ``x``; None when no image is padded on it (or
        ``x`` is not a batch map of the call)."""
        if not self.active or x.dim() != 4 or x.shape[0] != len(self.sizes):
            return None
        hw = tuple(x.shape[-2:])
        valid = self.valid(hw)
        return None if all(v == hw for v in valid) else valid

    def mask(self, x: Tensor) -> Optional[Tensor]:
        """[B, 1, H, W] mask for a map like ``x``, or None when no image is padded on it."""
        valid = self.padded(x)
        if valid is None:
            return None
        key = (tuple(x.shape[-2:]), x.dtype, x.device)
        if key not in self._masks:
            self._masks[key] = region_mask(valid, x.shape[-2:], x)
        return self._masks[key]

    def zero_padding(self, x: Tensor) -> Tensor:
        """``x`` with zeros beyond every image: ``x`` itself, changed in place, when autograd
        is off (and ``x`` is dense); else a masked copy (or ``x`` when nothing is padded)."""
        valid = self.padded(x)
        if valid is None:
            return x
        if not torch.is_grad_enabled() and (
                x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last)):
            return zero_beyond_(x, valid)
        return x * self.mask(x)

    def masked(self, x: Tensor) -> Tensor:
        """``x`` zeroed beyond every image (``x`` itself when it is known to be already)."""
        if self.is_clean(x):
            return x
        x = self.zero_padding(x)
        self.mark_clean(x)
        return x

    def mark_clean(self, x: Tensor) -> None:
        if self.active:
            self._clean[id(x)] = x

    def is_clean(self, x: Tensor) -> bool:
        return self._clean.get(id(x)) is x

    def edges_replicated(self, x: Tensor) -> Tensor:
        """:func:`replicate_edges` of a batch map, cached for the call (cascade stages).

        Without autograd the map is changed in place (only the rows and columns beyond the
        images change, and only RoI extractors read them after the dense heads).
        """
        if not self.active or x.dim() != 4 or x.shape[0] != len(self.sizes):
            return x
        hit = self._edges.get(id(x))
        if hit is None or hit[0] is not x:
            valid = self.valid(x.shape[-2:])
            if torch.is_grad_enabled() and x.requires_grad:
                out = replicate_edges(x, valid)
            else:
                out = replicate_edges(x, valid, in_place=True)
                self._clean.pop(id(x), None)
            hit = (x, out)
            self._edges[id(x)] = hit
        return hit[1]


def padding_state(module: nn.Module) -> Optional[PaddingState]:
    """The state a padding-aware submodule was given, or None."""
    return getattr(module, STATE_ATTR, None)


# --- hooks --------------------------------------------------------------------------------

def _masked_input_hook(state: PaddingState):
    def hook(module, args):
        if not state.active or not args or not isinstance(args[0], Tensor) or \
                state.is_clean(args[0]):
            return None
        x = state.zero_padding(args[0])
        # In place (no autograd): the caller's map itself is zero beyond the images now. Only
        # padded positions change, which the neck and heads mask or cut before they count.
        return None if x is args[0] else (x,) + tuple(args[1:])
    return hook


def _masked_output_hook(state: PaddingState):
    def hook(module, args, output):
        if not state.active:
            return None
        if isinstance(output, Tensor):
            return state.masked(output)
        if isinstance(output, (list, tuple)) and all(isinstance(o, Tensor) for o in output):
            return type(output)(state.masked(o) for o in output)
        return None
    return hook


def mask_conv_inputs(module: nn.Module, state: PaddingState) -> int:
    """Pre-hook every spatial convolution in ``module``: zero its input beyond each image."""
    count = 0
    for m in module.modules():
        if isinstance(m, nn.Conv2d) and (max(m.kernel_size) > 1 or max(m.stride) > 1):
            m.register_forward_pre_hook(_masked_input_hook(state))
            count += 1
    return count


class PerImageConv2d(nn.Conv2d):
    """A Conv2d that, without autograd and while the padding state has padded images, runs
    on each image's own region (a crop of the map) and leaves zeros beyond it.

    oneDNN sums a conv in an order that depends on the map's and the batch's size, so the same
    image alone and batched differed by about 1e-6 from the first neck conv on (docs/
    padding-aware.md, Exactness). On its crop, an image's conv has the same shape at any batch
    padding. The crop's own zero padding is the zeros beyond the image the conv saw before.
    With autograd, a string or non-zero padding mode, or nothing padded: the stock forward.
    """

    def forward(self, x: Tensor) -> Tensor:
        state = padding_state(self)
        valid = None
        if (state is not None and not torch.is_grad_enabled()
                and self.padding_mode == 'zeros' and not isinstance(self.padding, str)):
            valid = state.padded(x)
        if valid is None:
            return super().forward(x)
        layout = (torch.channels_last if x.is_contiguous(memory_format=torch.channels_last)
                  and not x.is_contiguous() else torch.contiguous_format)
        crops = [super(PerImageConv2d, self).forward(
            x[b:b + 1, :, :h, :w].contiguous(memory_format=layout))
            for b, (h, w) in enumerate(valid)]
        size = [(n + 2 * p - d * (k - 1) - 1) // s + 1 for n, k, s, p, d in zip(
            x.shape[-2:], self.kernel_size, self.stride, self.padding, self.dilation)]
        out = crops[0].new_zeros((x.shape[0], crops[0].shape[1], *size)).contiguous(
            memory_format=layout)
        for b, crop in enumerate(crops):
            out[b:b + 1, :, :crop.shape[2], :crop.shape[3]] = crop
        return out


def run_convs_per_image(module: nn.Module, state: PaddingState) -> int:
    """Make every plain ``nn.Conv2d`` in ``module`` a :class:`PerImageConv2d` (in place: same
    parameters); return how many."""
    count = 0
    for m in module.modules():
        if type(m) is nn.Conv2d:
            m.__class__ = PerImageConv2d
            setattr(m, STATE_ATTR, state)
            count += 1
    return count


def _toolkit_parts(inner: nn.Module, state: PaddingState) -> List[str]:
    """Make the neck and the heads padding-aware; return what was done, for the log."""
    done = []
    neck = getattr(inner, 'neck', None)
    if isinstance(neck, nn.Module):
        necks = neck if isinstance(neck, (nn.ModuleList, nn.Sequential)) else [neck]
        for n in necks:
            mask_conv_inputs(n, state)
            run_convs_per_image(n, state)
            n.register_forward_hook(_masked_output_hook(state))
            done.append(type(n).__name__)
    for name in ('rpn_head', 'bbox_head', 'roi_head', 'decode_head', 'auxiliary_head'):
        head = getattr(inner, name, None)
        if not isinstance(head, nn.Module):
            continue
        heads = head if isinstance(head, nn.ModuleList) else [head]
        for h in heads:
            done.extend(_make_head_aware(h, name, state))
    return done


def _make_head_aware(head: nn.Module, name: str, state: PaddingState) -> List[str]:
    module = type(head).__module__
    if module.startswith('mmdet'):
        from . import padding_mmdet
        return padding_mmdet.make_aware(head, name, state)
    if module.startswith('mmseg'):
        from . import padding_mmseg
        return padding_mmseg.make_aware(head, name, state)
    if name != 'roi_head':  # unknown image-space head: at least its convs see zeros beyond
        mask_conv_inputs(head, state)
    return [f'{type(head).__name__} (convs only)']


def enable_padding_aware(model: nn.Module) -> nn.Module:
    """Make a detector/segmentor with our backbone keep batch padding out of its outputs.

    Idempotent. The backbone gets each image's size (it should be built with
    ``mask_padding=True``: its own padding is then masked too); the neck and heads are made
    padding-aware as described in the module docstring. Raises TypeError when the model has no
    ``SwinTransformer`` of ours as ``backbone``.
    """
    from .swin import SwinTransformer
    inner = model.module if is_model_wrapper(model) else model
    backbone = getattr(inner, 'backbone', None)
    if not isinstance(backbone, SwinTransformer):
        raise TypeError('enable_padding_aware needs a model whose backbone is '
                        f'swin_rpe_plugin.SwinTransformer, got {type(backbone).__name__}')
    if getattr(inner, _ATTR, False):
        return model
    state = PaddingState()

    def model_pre_hook(module, args, kwargs):
        state.reset()
        samples = kwargs.get('data_samples', args[1] if len(args) > 1 else None)
        state.sizes = valid_sizes_from_samples(samples)

    def model_post_hook(module, args, output):
        state.reset()

    def backbone_pre_hook(module, args, kwargs):
        sizes = state.sizes
        if sizes is None or kwargs.get('valid_sizes') is not None or not args:
            return None
        x = args[0]
        if x.shape[0] != len(sizes) or any(h > x.shape[2] or w > x.shape[3] for h, w in sizes):
            return None
        state.input_hw = (int(x.shape[2]), int(x.shape[3]))
        return args, {**kwargs, 'valid_sizes': sizes}

    def backbone_post_hook(module, args, kwargs, output):
        if state.active and isinstance(output, (list, tuple)):
            for out in output:  # zero beyond every image already
                state.mark_clean(out)

    inner.register_forward_pre_hook(model_pre_hook, with_kwargs=True)
    inner.register_forward_hook(model_post_hook, always_call=True)
    backbone.register_forward_pre_hook(backbone_pre_hook, with_kwargs=True)
    backbone.register_forward_hook(backbone_post_hook, with_kwargs=True)
    parts = _toolkit_parts(inner, state)
    setattr(inner, _ATTR, True)
    setattr(inner, STATE_ATTR, state)
    if not backbone.mask_padding:
        print_log('padding-aware: the backbone has mask_padding=False; its own window padding '
                  'still takes part in attention', logger='current')
    if parts:
        print_log(f'padding-aware past the backbone: {", ".join(parts)}', logger='current')
    return model


@HOOKS.register_module()
class PaddingAwareHook(Hook):
    """Turn on :func:`enable_padding_aware` for the runner's model before it runs."""

    def before_run(self, runner) -> None:
        enable_padding_aware(runner.model)
        print_log('padding-aware: outputs ignore batch padding (valid sizes from img_shape)',
                  logger='current')
