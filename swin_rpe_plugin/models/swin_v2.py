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
Windows, padding, shift masks, window plans, ``mask_padding`` / ``valid_sizes``, the block's one
definition (``ops/block.py``: its halves with ``post_norm`` and ``logit_scale``, each device's
kernels), ``with_cp``, ``frozen_stages`` and input checks are V1's.

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
from mmengine.model.weight_init import constant_init
from torch import Tensor

from ..compat import is_compiling
from ..ops import (continuous_position_bias, log_spaced_relative_coords,
                   resolve_pretrained_window, scaled_cosine_query_key, to_window_tuple)
from ..ops.kept import sources_key
from ..registry import MODELS
from .layers import PatchMerging, SwinBlock, WindowMSA
from .swin import SwinTransformer


class WindowMSAV2(WindowMSA):
    """Window attention with scaled cosine attention and a continuous position bias."""

    cpb_hidden_dims = 512

    def __init__(self, embed_dims: int, num_heads: int, window_size, qkv_bias: bool = True,
                 qk_scale: Optional[float] = None, attn_drop_rate: float = 0.,
                 proj_drop_rate: float = 0., fused_attention: bool = True,
                 pretrained_window_size=0):
        if qk_scale is not None:
            raise ValueError(f'qk_scale={qk_scale!r} does not apply to SwinV2: cosine attention '
                             'learns its own logit scale; leave it None')
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

    def qkv_bias_sources(self) -> list:
        return [self.q_bias, self.v_bias]

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
    """(S)W-MSA -> norm -> residual -> FFN -> norm -> residual (res-post-norm); the attention
    options: ``pretrained_window_size`` (see :class:`WindowMSAV2`)."""
    window_attention_class = WindowMSAV2
    post_norm = True


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

    def __init__(self, pretrain_img_size=256, window_size=8, pretrained_window_size=0,
                 **kwargs):
        """The defaults are SwinV2-T's (mmpretrain's and the paper's); ``kwargs`` are
        :class:`SwinTransformer`'s, with its defaults."""
        unsupported = sorted({'qk_scale', 'patch_norm', 'convert_weights'} & set(kwargs))
        if unsupported:
            raise TypeError(f'SwinTransformerV2 does not take {", ".join(unsupported)} '
                            '(cosine attention has its own scale, the patch norm is always on, '
                            'checkpoints are converted on load): remove it')
        # Resolved per stage by _block_options while the base class builds the stages.
        self.pretrained_window_size = pretrained_window_size
        super().__init__(pretrain_img_size=pretrain_img_size, window_size=window_size,
                         **kwargs)

    @property
    def pretrained_window_sizes(self) -> Tuple[Tuple[int, int], ...]:
        """One (h, w) pretrained window per stage (:func:`pretrained_windows_per_stage`)."""
        return pretrained_windows_per_stage(self.pretrained_window_size, self.window_size,
                                            self.num_layers)

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
        super().init_weights()
        if self.init_cfg is None:
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
