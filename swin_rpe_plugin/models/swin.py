"""Swin Transformer backbone (Liu et al., 2021, arXiv:2103.14030) for mmdet and mmseg.

Constructor-compatible with mmdet 3.3's ``SwinTransformer`` (same arguments, defaults and
parameter names), without importing it. Differences, all deliberate:
- ``window_size`` may be (h, w); the shift of shifted blocks is (h // 2, w // 2);
- shift masks are built once per padded size and cached, not per block and per forward;
- ``mask_padding=True`` keeps the window padding out of attention as keys;
- ``pretrained=`` is honoured (mmdet's base-class call overwrites it), ``train()`` returns the
  module, bad arguments raise, bias tables are initialised (mmdet leaves them at zero);
- an absolute position embedding is resized to the input's patch grid instead of failing.
"""
import warnings
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer
from mmengine.model import BaseModule
from mmengine.model.weight_init import constant_init, trunc_normal_, trunc_normal_init
from torch import Tensor

from ..compat import register_load_state_dict_pre_hook
from ..ops import resize_absolute_pos_embed, to_window_tuple
from ..ops.masks import region_mask
from ..ops.dispatch import block_kernels, is_tracing
from ..ops.kept import new_generation
from ..registry import MODELS
from .layers import HW, PatchEmbed, PatchMerging, SwinBlock, WindowMSA
from .load_hooks import resize_bias_tables_on_load


class SwinBlockSequence(nn.Module):
    """One stage: blocks alternating regular and shifted windows, then optional merging."""

    def __init__(self, embed_dims: int, num_heads: int, feedforward_channels: int, depth: int,
                 window_size, drop_path_rate: Sequence[float],
                 downsample: Optional[PatchMerging] = None, mask_padding: bool = False,
                 block_class: type = SwinBlock, **block_kwargs):
        super().__init__()
        self.window_size = to_window_tuple(window_size)
        self.mask_padding = mask_padding
        self.blocks = nn.ModuleList([
            block_class(embed_dims, num_heads, feedforward_channels, self.window_size,
                        shift=i % 2 == 1, drop_path_rate=drop_path_rate[i], **block_kwargs)
            for i in range(depth)])
        self.downsample = downsample

    def forward(self, x: Tensor, hw_shape: HW, valid: Optional[tuple] = None,
                token_mask: Optional[Tensor] = None,
                kernels: Optional[str] = None) -> Tuple[Tensor, HW, Tensor, HW]:
        """x: [B, H*W, C] -> (merged x, its hw, stage output, hw).

        Args:
            valid: per-image (h, w) token regions, or None (then ``mask_padding`` decides).
            token_mask: [B, H*W, 1], 1 on valid tokens: zeroes the rest before merging.
            kernels: the blocks' kernels (``ops.dispatch.block_kernels``, asked once per
                backbone forward), or None: the modules' plain ops.
        """
        if valid is None and self.mask_padding:
            valid = tuple(hw_shape)
        # One plan per shift, shared by every block of the stage (cached across forwards): the
        # first two blocks' shifts (blocks alternate), built in straight-line code: dynamo on
        # torch 2.1 breaks its graph on a ModuleList slice, and where a torch builds plans
        # eagerly under compile, a graph break inside a loop makes it compile every block alone.
        first = self.blocks[0]
        first_plan = other_plan = first.attn.plan(hw_shape, valid, x)
        if len(self.blocks) > 1 and self.blocks[1].shift_size != first.shift_size:
            other_plan = self.blocks[1].attn.plan(hw_shape, valid, x)
        for block in self.blocks:
            x = block(x, hw_shape,
                      first_plan if block.shift_size == first.shift_size else other_plan,
                      kernels)
        if self.downsample is None:
            return x, hw_shape, x, hw_shape
        x_down, down_hw = self.downsample(x if token_mask is None else x * token_mask, hw_shape,
                                          kernels)
        return x_down, down_hw, x, hw_shape


@MODELS.register_module()
class SwinTransformer(BaseModule):
    """Swin Transformer backbone with 2D relative position bias.

    Args are those of mmdet 3.3 ``SwinTransformer`` (same defaults and meanings), plus:
        mask_padding (bool): keep the padding added to reach whole windows out of attention
            as keys. Default False, so outputs equal mmdet's.
        fused_attention (bool): use ``F.scaled_dot_product_attention``; False runs the
            explicit matmul/softmax of the reference code. Default True.

    Forward: [B, in_channels, H, W] -> one [B, C_i, H_i, W_i] map per out index, with
    H_0 = ceil(H / patch_size) and H_i = ceil(H_{i-1} / strides[i]).
    """
    # What SwinTransformerV2 swaps in; the stage skeleton is shared.
    block_class = SwinBlock
    merging_class = PatchMerging

    def __init__(self,
                 pretrain_img_size=224,
                 in_channels=3,
                 embed_dims=96,
                 patch_size=4,
                 window_size=7,
                 mlp_ratio=4,
                 depths=(2, 2, 6, 2),
                 num_heads=(3, 6, 12, 24),
                 strides=(4, 2, 2, 2),
                 out_indices=(0, 1, 2, 3),
                 qkv_bias=True,
                 qk_scale=None,
                 patch_norm=True,
                 drop_rate=0.,
                 attn_drop_rate=0.,
                 drop_path_rate=0.1,
                 use_abs_pos_embed=False,
                 act_cfg=dict(type='GELU'),
                 norm_cfg=dict(type='LN'),
                 with_cp=False,
                 pretrained=None,
                 convert_weights=False,
                 frozen_stages=-1,
                 init_cfg=None,
                 mask_padding=False,
                 fused_attention=True):
        if init_cfg is not None and pretrained is not None:
            raise ValueError('init_cfg and pretrained cannot be set at the same time, got '
                             f'init_cfg={init_cfg!r} and pretrained={pretrained!r}')
        if pretrained is not None and not isinstance(pretrained, str):
            raise TypeError(f'pretrained must be a str or None, got {type(pretrained).__name__}')
        if isinstance(pretrained, str):
            warnings.warn('pretrained is deprecated, use init_cfg=dict(type="Pretrained", '
                          'checkpoint=...) instead', DeprecationWarning)
            init_cfg = dict(type='Pretrained', checkpoint=pretrained)
        # Base class first, so nothing set below is overwritten by it.
        super().__init__(init_cfg=init_cfg)

        depths, num_heads, strides, out_indices = (
            _as_tuple(v, name) for v, name in ((depths, 'depths'), (num_heads, 'num_heads'),
                                               (strides, 'strides'),
                                               (out_indices, 'out_indices')))
        _check_arguments(in_channels, embed_dims, patch_size, depths, num_heads, strides,
                         out_indices, frozen_stages, mlp_ratio,
                         dict(drop_rate=drop_rate, attn_drop_rate=attn_drop_rate,
                              drop_path_rate=drop_path_rate))
        self.num_layers = num_layers = len(depths)
        patch = to_window_tuple(patch_size, 'patch_size')
        if isinstance(pretrain_img_size, tuple) and len(pretrain_img_size) == 1:
            pretrain_img_size = pretrain_img_size * 2  # (224,) means square, as in mmseg/mmdet
        self.pretrain_img_size = to_window_tuple(pretrain_img_size, 'pretrain_img_size')
        self.window_size = to_window_tuple(window_size)
        self.in_channels = in_channels
        self.out_indices = out_indices
        self.frozen_stages = frozen_stages
        self.convert_weights = convert_weights
        self.use_abs_pos_embed = use_abs_pos_embed
        self.mask_padding = mask_padding

        self.patch_embed = PatchEmbed(in_channels, embed_dims, patch,
                                      norm_cfg if patch_norm else None)
        if use_abs_pos_embed:
            self.pos_embed_grid = (self.pretrain_img_size[0] // patch[0],
                                   self.pretrain_img_size[1] // patch[1])
            self.absolute_pos_embed = nn.Parameter(
                torch.zeros(1, self.pos_embed_grid[0] * self.pos_embed_grid[1], embed_dims))
        self.drop_after_pos = nn.Dropout(p=drop_rate)

        dpr = [x.item() for x in torch.linspace(0, drop_path_rate, sum(depths))]
        self.stages = nn.ModuleList()
        channels = embed_dims
        for i in range(num_layers):
            downsample = None
            if i < num_layers - 1:
                downsample = self.merging_class(channels, 2 * channels, strides[i + 1],
                                                norm_cfg if patch_norm else None)
            self.stages.append(SwinBlockSequence(
                channels, num_heads[i], int(mlp_ratio * channels), depths[i], self.window_size,
                dpr[sum(depths[:i]):sum(depths[:i + 1])], downsample, mask_padding,
                self.block_class, qkv_bias=qkv_bias, qk_scale=qk_scale, drop_rate=drop_rate,
                attn_drop_rate=attn_drop_rate, act_cfg=act_cfg, norm_cfg=norm_cfg,
                with_cp=with_cp, fused_attention=fused_attention, **self._block_options(i)))
            if downsample is not None:
                channels = downsample.out_channels

        self.num_features = [int(embed_dims * 2**i) for i in range(num_layers)]
        for i in out_indices:
            self.add_module(f'norm{i}', build_norm_layer(norm_cfg, self.num_features[i])[1])
        # Whatever loads a state dict (load_from, init_detector, a whole detector's
        # load_state_dict), bias tables saved at another window are resized to this one.
        register_load_state_dict_pre_hook(self, resize_bias_tables_on_load)
        # Frozen from construction on, not first in train(): a DistributedDataParallel wrapper
        # made before train() (mmengine's Runner order) registers only the parameters that
        # need a gradient, so it never waits for one a frozen stage does not produce.
        self._freeze_stages()

    def _block_options(self, stage: int) -> dict:
        """Extra keyword arguments for the blocks of a stage (SwinV2: its pretrained window)."""
        return {}

    @property
    def out_channels(self) -> List[int]:
        """Channels of each returned map, in out_indices order."""
        return [self.num_features[i] for i in self.out_indices]

    @property
    def out_strides(self) -> List[int]:
        """Stride in pixels of each returned map, in out_indices order."""
        strides, s = [], self.patch_embed.patch_size[0]
        for i, stage in enumerate(self.stages):
            strides.append(s)
            if stage.downsample is not None:
                s *= stage.downsample.stride
        return [strides[i] for i in self.out_indices]

    def train(self, mode: bool = True) -> 'SwinTransformer':
        """Set train/eval mode, keeping frozen stages in eval mode."""
        super().train(mode)
        self._freeze_stages()
        new_generation()  # what trained before is never served from a kept copy (ops/kept.py)
        return self

    def _freeze_stages(self) -> None:
        """Exactly what mmdet freezes: patch embed (+ abs pos embed), then stages 0..k-1 with
        their patch merging and their output norms: no gradient, eval mode. Called at
        construction and by every ``train()``, so what is frozen stays so whatever mode is
        asked (mmdet freezes in ``train()`` only: too late for DDP, docs/training.md)."""
        if self.frozen_stages >= 0:
            self.patch_embed.eval()
            for param in self.patch_embed.parameters():
                param.requires_grad = False
            if self.use_abs_pos_embed:
                self.absolute_pos_embed.requires_grad = False
            self.drop_after_pos.eval()
        for i in range(1, self.frozen_stages + 1):
            frozen = [self.stages[i - 1]]
            if (i - 1) in self.out_indices:
                frozen.append(getattr(self, f'norm{i - 1}'))
            for module in frozen:
                module.eval()
                for param in module.parameters():
                    param.requires_grad = False

    def init_weights(self) -> None:
        """Truncated-normal init as the official code, or load ``init_cfg`` 'Pretrained'."""
        if self.init_cfg is not None and self.init_cfg.get('type') == 'Pretrained':
            from ..checkpoint import load_pretrained  # the checkpoint layer sits above models
            load_pretrained(self, self.init_cfg['checkpoint'],
                            strict=self.init_cfg.get('strict', True),
                            allow_pickle=self.init_cfg.get('allow_pickle', False))
            return
        if self.init_cfg is not None:
            super().init_weights()
            return
        if self.use_abs_pos_embed:
            trunc_normal_(self.absolute_pos_embed, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_init(m, std=.02, bias=0.)
            elif isinstance(m, nn.LayerNorm):
                constant_init(m, 1.0)
            elif isinstance(m, WindowMSA):
                m.reset_parameters()

    def forward(self, x: Tensor, valid_sizes=None) -> List[Tensor]:
        """[B, in_channels, H, W] -> list of [B, C_i, H_i, W_i], one per out index.

        Args:
            valid_sizes: per image, the (h, w) in pixels of the unpadded image at the top-left
                of x (a [B, 2] integer tensor or a sequence of pairs), or None. Tokens outside
                an image's region are then kept out of attention as keys, zeroed before patch
                merging and zero in the outputs, so an image's features do not depend on how
                its batch was padded.
        """
        if not isinstance(x, Tensor) or x.dim() != 4:
            raise ValueError('input must be a 4-D tensor [B, C, H, W], got '
                             f'{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}')
        if x.shape[1] != self.in_channels:
            raise ValueError(f'input has {x.shape[1]} channels but in_channels='
                             f'{self.in_channels} (input shape {tuple(x.shape)})')
        tracing = is_tracing(x)
        if not tracing and x.numel() == 0:  # sizes are symbolic under a tracer
            raise ValueError(f'input {tuple(x.shape)} is empty: batch, height and width must be '
                             '>= 1')
        if not x.is_floating_point():
            raise TypeError(f'input must be a floating-point tensor, got {x.dtype} (convert and '
                            'normalise images first, as the data preprocessor does)')
        if tracing and valid_sizes is not None:
            raise ValueError('valid_sizes cannot be traced or exported (they are per-image data);'
                             ' export with mask_padding=True, which masks the window padding')
        valid = _parse_valid_sizes(valid_sizes, x.shape)
        if valid is not None:  # the batch's pad value need not be 0: zero padding pixels
            x = x * region_mask(valid, x.shape[2:], x)
        x, hw_shape = self.patch_embed(x)
        if self.use_abs_pos_embed:
            x = x + self._pos_embed_for(hw_shape, tracing)
        x = self.drop_after_pos(x)

        patch = self.patch_embed.patch_size
        valid = None if valid is None else tuple(
            (-(-h // patch[0]), -(-w // patch[1])) for h, w in valid)
        outs = []
        kernels = block_kernels(x)
        for i, stage in enumerate(self.stages):
            token_mask = None
            if valid is not None and any(v != tuple(hw_shape) for v in valid):
                token_mask = region_mask(valid, hw_shape, x).view(x.shape[0], -1, 1)
            x, next_hw, out, out_hw = stage(x, hw_shape, valid, token_mask, kernels)
            if i in self.out_indices:
                out = getattr(self, f'norm{i}')(out)
                if token_mask is not None:
                    out = out * token_mask
                outs.append(out.view(-1, *out_hw, self.num_features[i])
                            .permute(0, 3, 1, 2).contiguous())
            if valid is not None and stage.downsample is not None:
                s = stage.downsample.stride
                valid = tuple((-(-h // s), -(-w // s)) for h, w in valid)
            hw_shape = next_hw
        return outs

    def _pos_embed_for(self, hw_shape: HW, tracing: bool = False) -> Tensor:
        if not tracing and tuple(hw_shape) == self.pos_embed_grid:
            return self.absolute_pos_embed
        return resize_absolute_pos_embed(self.absolute_pos_embed, self.pos_embed_grid, hw_shape)


def _as_tuple(value, name: str) -> tuple:
    try:
        return tuple(value)
    except TypeError:
        raise TypeError(f'{name} must be a sequence, got {value!r}') from None


def _parse_valid_sizes(valid_sizes, shape) -> Optional[Tuple[Tuple[int, int], ...]]:
    """Validate per-image (h, w) pixel sizes against an input of ``shape`` [B, C, H, W]."""
    if valid_sizes is None:
        return None
    if isinstance(valid_sizes, Tensor):
        if valid_sizes.dtype.is_floating_point or valid_sizes.shape != (shape[0], 2):
            raise ValueError(f'valid_sizes must be an integer tensor of shape [B={shape[0]}, 2], '
                             f'got {valid_sizes.dtype} of shape {tuple(valid_sizes.shape)}')
        valid_sizes = valid_sizes.tolist()
    try:
        sizes = tuple((int(h), int(w)) for h, w in valid_sizes)
    except (TypeError, ValueError):
        raise TypeError('valid_sizes must be a sequence of (h, w) pairs, got '
                        f'{valid_sizes!r}') from None
    if len(sizes) != shape[0]:
        raise ValueError(f'valid_sizes has {len(sizes)} entries but the batch has {shape[0]} '
                         'images')
    for i, (h, w) in enumerate(sizes):
        if not (1 <= h <= shape[2] and 1 <= w <= shape[3]):
            raise ValueError(f'valid_sizes[{i}]=({h}, {w}) must be within 1..{shape[2]} x '
                             f'1..{shape[3]} (the input size)')
    return sizes


def _check_arguments(in_channels, embed_dims, patch_size, depths, num_heads, strides,
                     out_indices, frozen_stages, mlp_ratio, rates) -> None:
    if not isinstance(in_channels, int) or in_channels < 1:
        raise ValueError(f'in_channels must be a positive int, got {in_channels!r}')
    if not isinstance(embed_dims, int) or embed_dims < 1:
        raise ValueError(f'embed_dims must be a positive int, got {embed_dims!r}')
    if not isinstance(mlp_ratio, (int, float)) or mlp_ratio <= 0:
        raise ValueError(f'mlp_ratio must be a positive number, got {mlp_ratio!r}')
    for name, rate in rates.items():
        if not isinstance(rate, (int, float)) or not 0 <= rate < 1:
            raise ValueError(f'{name} must be in [0, 1), got {rate!r}')
    for name, seq in (('depths', depths), ('num_heads', num_heads), ('strides', strides)):
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in seq):
            raise TypeError(f'{name} must be a sequence of ints, got {seq!r}')
    if min(strides) < 1:
        raise ValueError(f'strides {strides} must all be >= 1')
    if len(depths) != len(num_heads):
        raise ValueError(f'depths {depths} and num_heads {num_heads} must have the same length')
    if len(strides) != len(depths):
        raise ValueError(f'strides {strides} must have one entry per stage ({len(depths)})')
    if to_window_tuple(patch_size, 'patch_size') != to_window_tuple(strides[0], 'strides[0]'):
        raise ValueError(f'patch_size {patch_size!r} must equal strides[0] {strides[0]!r} '
                         '(non-overlapping patch embedding)')
    for i, (depth, heads) in enumerate(zip(depths, num_heads)):
        dims = embed_dims * 2**i
        if depth < 1 or heads < 1:
            raise ValueError(f'depths[{i}]={depth} and num_heads[{i}]={heads} must be >= 1')
        if dims % heads:
            raise ValueError(f'embed dims {dims} of stage {i} (embed_dims={embed_dims}) are not '
                             f'divisible by num_heads[{i}]={heads}')
    for i in out_indices:
        if not isinstance(i, int) or not 0 <= i < len(depths):
            raise ValueError(f'out_indices {out_indices}: index {i!r} is out of range for '
                             f'{len(depths)} stages')
    if not -1 <= frozen_stages <= len(depths):
        raise ValueError(f'frozen_stages={frozen_stages} must be in [-1, {len(depths)}]')
