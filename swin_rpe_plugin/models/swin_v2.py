"""Swin Transformer V2 backbone (Liu et al., 2022, arXiv:2111.09883) for mmdet and mmseg.

The V1 backbone (``swin.py``) with what V2 changes, and nothing else:
- scaled cosine attention: q and k are normalised and a learned per-head logit scale (clamped
  at log 100) is folded into q, so the one ``window_attention`` (fused or explicit) runs it with
  scale 1;
- continuous position bias: 16 * sigmoid of a 2-layer MLP (512 hidden) on log-spaced window
  offsets normalised by the *pretrained* window (``ops/continuous_position.py``), in place of the
  bias table: a model trained with 8x8 windows runs with 12x12 or 16x16 ones, nothing resized;
- res-post-norm: each block norms its attention and FFN outputs before adding the residual;
- patch merging norms after the reduction (over 2C channels, not 4C);
- q and v have a bias, k none (``q_bias``, ``v_bias``).
Windows, padding, shift masks, window plans, ``mask_padding`` / ``valid_sizes``, the fast linear
and attention paths, recomputation, ``with_cp``, ``frozen_stages`` and input checks are V1's.

Small maps: when a stage map is not larger than the window, the window is kept and the map is
padded (and shifted) to whole windows, as in V1 and the detection code. The classification
reference code (official, transformers, timm) shrinks the window to the map and drops the shift
instead, which dense prediction must not do (features would change with the input size).

Parameter names are mmpretrain 1.x ``SwinTransformerV2``'s (``attn.w_msa.cpb_mlp.0``,
``q_bias``, ``logit_scale``, ``norm1`` = post-attention norm) with patch merging at the end of
each stage as in V1 (mmpretrain puts it at the start of the next).
"""
import math
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer
from mmengine.model.weight_init import constant_init, trunc_normal_, trunc_normal_init
from torch import Tensor

from ..compat import is_compiling
from ..ops import (continuous_position_bias, log_spaced_relative_coords,
                   resolve_pretrained_window, scaled_cosine_query_key, to_window_tuple)
from ..ops.kept import sources_key
from ..registry import MODELS
from .layers import PatchMerging, SwinBlock, WindowMSA
from .swin import SwinTransformer, _as_tuple


class WindowMSAV2(WindowMSA):
    """Window attention with scaled cosine attention and a continuous position bias."""

    cpb_hidden_dims = 512

    def __init__(self, embed_dims: int, num_heads: int, window_size, qkv_bias: bool = True,
                 attn_drop_rate: float = 0., proj_drop_rate: float = 0.,
                 fused_attention: bool = True, pretrained_window_size=0):
        # qkv without bias: V2 learns q and v biases only (k's would not cancel under the
        # cosine normalisation, and the reference has none).
        super().__init__(embed_dims, num_heads, window_size, False, None, attn_drop_rate,
                         proj_drop_rate, fused_attention)
        self.pretrained_window_size = resolve_pretrained_window(self.window_size,
                                                                pretrained_window_size)
        # Derived from the two windows, so never saved and never read from a checkpoint.
        self.register_buffer('relative_coords_table', log_spaced_relative_coords(
            self.window_size, self.pretrained_window_size), persistent=False)
        self.q_bias = nn.Parameter(torch.zeros(embed_dims)) if qkv_bias else None
        self.v_bias = nn.Parameter(torch.zeros(embed_dims)) if qkv_bias else None

    def init_position_bias(self) -> None:
        self.logit_scale = nn.Parameter(torch.full((self.num_heads, 1, 1), math.log(10.0)))
        self.cpb_mlp = nn.Sequential(nn.Linear(2, self.cpb_hidden_dims), nn.ReLU(),
                                     nn.Linear(self.cpb_hidden_dims, self.num_heads, bias=False))

    def qkv_projection_bias(self) -> Optional[Tensor]:
        if self.q_bias is None:
            return None
        return torch.cat([self.q_bias, torch.zeros_like(self.v_bias), self.v_bias])

    def query_key(self, q: Tensor, k: Tensor) -> Tuple[Tensor, Tensor, float]:
        q, k = scaled_cosine_query_key(q, k, self.logit_scale)
        return q, k, 1.0

    def relative_position_bias(self, tracing: Optional[bool] = None,
                               contiguous: bool = True) -> Tensor:
        """[heads, N, N] continuous position bias (contiguous; the arguments as V1's).

        Reused across forwards while the MLP is unchanged and no gradient is needed
        (inference); recomputed whenever autograd must see it, and under torch.compile.
        """
        params = (self.cpb_mlp[0].weight, self.cpb_mlp[0].bias, self.cpb_mlp[2].weight)
        if ((torch.is_grad_enabled() and any(p.requires_grad for p in params))
                or (is_compiling() if tracing is None else tracing)):
            return continuous_position_bias(self.relative_coords_table,
                                            self.relative_position_index, *params)
        return self._kept_bias.get(
            sources_key(params, params[0].dtype, params[0].device),
            lambda: continuous_position_bias(self.relative_coords_table,
                                             self.relative_position_index,
                                             *(p.detach() for p in params)))

    def reset_parameters(self) -> None:
        """The reference init of what is not a Linear: logit scale log(10), zero q/v biases."""
        nn.init.constant_(self.logit_scale, math.log(10.0))
        if self.q_bias is not None:
            nn.init.zeros_(self.q_bias)
            nn.init.zeros_(self.v_bias)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # mmpretrain/official/torchvision checkpoints save the coordinates; ours are rebuilt.
        state_dict.pop(prefix + 'relative_coords_table', None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class SwinBlockV2(SwinBlock):
    """(S)W-MSA -> norm -> residual -> FFN -> norm -> residual (res-post-norm)."""
    window_attention_class = WindowMSAV2

    def __init__(self, embed_dims: int, num_heads: int, feedforward_channels: int,
                 window_size=8, shift: bool = False, qkv_bias: bool = True,
                 qk_scale: Optional[float] = None, drop_rate: float = 0.,
                 attn_drop_rate: float = 0., drop_path_rate: float = 0.,
                 act_cfg: Optional[dict] = None, norm_cfg: Optional[dict] = None,
                 with_cp: bool = False, fused_attention: bool = True,
                 pretrained_window_size=0):
        # qk_scale is accepted for the shared stage signature; cosine attention has its own.
        w_msa = WindowMSAV2(embed_dims, num_heads, window_size, qkv_bias, attn_drop_rate,
                            drop_rate, fused_attention, pretrained_window_size)
        super().__init__(embed_dims, num_heads, feedforward_channels, window_size, shift,
                         qkv_bias, None, drop_rate, attn_drop_rate, drop_path_rate, act_cfg,
                         norm_cfg, with_cp, fused_attention, post_norm=True, w_msa=w_msa)


class PatchMergingV2(PatchMerging):
    """Concatenate each 2x2 neighbourhood (nn.Unfold's channel order), reduce, then norm."""
    norm_after = True

    def __init__(self, in_channels: int, out_channels: int, stride: int,
                 norm_cfg: Optional[dict]):
        super().__init__(in_channels, out_channels, stride, norm_cfg=None)
        self.norm = build_norm_layer(norm_cfg, out_channels)[1] if norm_cfg else None


@MODELS.register_module()
class SwinTransformerV2(SwinTransformer):
    """Swin Transformer V2 backbone: cosine attention, continuous position bias, post-norm.

    Args are those of :class:`SwinTransformer` where they mean the same (``qk_scale``,
    ``patch_norm`` and ``convert_weights`` do not apply), plus:
        pretrained_window_size: the window the weights were trained with, which normalises the
            position-bias coordinates: an int, an (h, w) pair, or one of those per stage
            (a sequence as long as ``depths``); 0 means the window itself. Default 0.

    Forward: [B, in_channels, H, W] -> one [B, C_i, H_i, W_i] map per out index (normed by
    ``norm{i}``), H_0 = ceil(H / patch_size), H_i = ceil(H_{i-1} / strides[i]).
    """
    block_class = SwinBlockV2
    merging_class = PatchMergingV2

    def __init__(self,
                 pretrain_img_size=256,
                 in_channels=3,
                 embed_dims=96,
                 patch_size=4,
                 window_size=8,
                 mlp_ratio=4,
                 depths=(2, 2, 6, 2),
                 num_heads=(3, 6, 12, 24),
                 strides=(4, 2, 2, 2),
                 out_indices=(0, 1, 2, 3),
                 qkv_bias=True,
                 drop_rate=0.,
                 attn_drop_rate=0.,
                 drop_path_rate=0.1,
                 use_abs_pos_embed=False,
                 act_cfg=dict(type='GELU'),
                 norm_cfg=dict(type='LN'),
                 with_cp=False,
                 pretrained=None,
                 frozen_stages=-1,
                 init_cfg=None,
                 mask_padding=False,
                 fused_attention=True,
                 pretrained_window_size=0):
        # Resolved first: _block_options reads it while the base class builds the stages.
        self.pretrained_window_sizes = pretrained_windows_per_stage(
            pretrained_window_size, window_size, len(_as_tuple(depths, 'depths')))
        super().__init__(
            pretrain_img_size=pretrain_img_size, in_channels=in_channels, embed_dims=embed_dims,
            patch_size=patch_size, window_size=window_size, mlp_ratio=mlp_ratio, depths=depths,
            num_heads=num_heads, strides=strides, out_indices=out_indices, qkv_bias=qkv_bias,
            qk_scale=None, patch_norm=True, drop_rate=drop_rate, attn_drop_rate=attn_drop_rate,
            drop_path_rate=drop_path_rate, use_abs_pos_embed=use_abs_pos_embed,
            act_cfg=act_cfg, norm_cfg=norm_cfg, with_cp=with_cp, pretrained=pretrained,
            frozen_stages=frozen_stages, init_cfg=init_cfg, mask_padding=mask_padding,
            fused_attention=fused_attention)

    def _block_options(self, stage: int) -> dict:
        return dict(pretrained_window_size=self.pretrained_window_sizes[stage])

    def window_transfer_notes(self) -> List[str]:
        """One line per stage whose window differs from the window its weights were trained
        with (the load report prints them)."""
        return [f'stage {i}: window {stage.window_size} uses the position-bias MLP of '
                f'pretrained window {self.pretrained_window_sizes[i]} (continuous position '
                'bias: coordinates rescaled, nothing resized)'
                for i, stage in enumerate(self.stages)
                if tuple(stage.window_size) != self.pretrained_window_sizes[i]]

    def init_weights(self) -> None:
        """The reference init (post-norms at zero, so blocks start as identities), or load
        ``init_cfg`` 'Pretrained'."""
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
            elif isinstance(m, WindowMSAV2):
                m.reset_parameters()
        for stage in self.stages:
            for block in stage.blocks:
                constant_init(block.norm1, 0.0)
                constant_init(block.norm2, 0.0)


def pretrained_windows_per_stage(pretrained_window_size, window_size, num_stages: int
                                 ) -> Tuple[Tuple[int, int], ...]:
    """One (h, w) pretrained window per stage; 0 resolves to the window itself.

    Accepts an int, an (h, w) pair, or a sequence of ``num_stages`` ints or pairs (with two
    stages, a pair of ints is read as one value per stage).
    """
    window = to_window_tuple(window_size)
    value = pretrained_window_size
    per_stage = (not isinstance(value, (int, str)) and hasattr(value, '__len__')
                 and len(value) == num_stages)
    values = list(value) if per_stage else [value] * num_stages
    try:
        return tuple(resolve_pretrained_window(window, v) for v in values)
    except ValueError:
        raise ValueError(f'pretrained_window_size must be an int >= 0, a pair (h, w), or one '
                         f'of those per stage ({num_stages} stages), got {value!r}; 0 means the '
                         'window itself') from None
