"""Thin modules of the Swin backbone: they hold parameters and call the functional core.

Module and parameter names follow mmdet 3.3 / mmseg 1.2 (``patch_embed.projection``,
``attn.w_msa.relative_position_bias_table``, ``ffn.layers.0.0``, ``downsample.reduction``), so a
state dict of the stock backbones loads here with ``strict=True``.
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from mmcv.cnn import build_activation_layer, build_norm_layer
from mmcv.cnn.bricks.drop import DropPath
from mmcv.cnn.bricks.transformer import build_dropout
from mmengine.model.weight_init import trunc_normal_
from torch import Tensor

from ..compat import has_forward_hooks, is_compiling, plan_outside_graph
from ..ops import (WindowPlan, cached_window_plan, gather_relative_position_bias,
                   gather_tokens, linear, linear_with_recomputed_input, relative_position_index,
                   table_rows, to_window_tuple, traceable_window_plan, window_attention_qkv)
from ..ops.dispatch import autocast_context, compute_dtype, is_tracing
from ..ops.block import KERNELS, attention_half, ffn_half, patch_merge
from ..ops.kept import KeptCopy, sources_key

HW = Tuple[int, int]


def is_layer_norm(module: Optional[nn.Module]) -> bool:
    """An ``nn.LayerNorm`` over the last dimension (mmcv's 'LN'), which ``ops.block`` writes
    out."""
    return type(module) is nn.LayerNorm and len(module.normalized_shape) == 1


def affine_tensors(module: Optional[nn.Module]) -> list:
    """The ``weight`` and ``bias`` a norm or activation prefix differentiates, read as
    attributes: ``parameters()`` misses the tensors a wrapper puts in their place (FSDP's
    unsharded views), whose gradients would then be lost."""
    return [t for t in (getattr(module, 'weight', None), getattr(module, 'bias', None))
            if t is not None]


def _corner_pad(x: Tensor, kernel: HW, stride: HW) -> Tensor:
    """Pad a [B, C, H, W] map at the bottom/right so every pixel is covered by a kernel.

    Same amounts as mmcv/mmdet ``AdaptivePadding(padding='corner')``, in integer arithmetic on
    non-negative sizes (traceable: no float ceil, no branch on sizes under a tracer).
    """
    h, w = x.shape[-2:]
    pads = [(size + s - 1) // s * s - s + k - size for size, k, s in zip((h, w), kernel, stride)]
    pads = [pad if k >= s else max(pad, 0) for pad, k, s in zip(pads, kernel, stride)]
    if is_tracing(x) or pads[0] or pads[1]:
        x = F.pad(x, (0, pads[1], 0, pads[0]))
    return x


class PatchEmbed(nn.Module):
    """Non-overlapping patch embedding: corner padding, patches as rows, one matmul, a norm.

    The projection is the conv of mmdet's ``PatchEmbed`` (``projection``, [C, C_in, ph, pw]),
    applied as a reshape plus one float32 matmul, also under autocast: it is ~1% of the FLOPs,
    and oneDNN's bf16 convolution is wrong on some CPUs. Reproduction (torch 2.13, Intel Xeon
    with AMX): ``F.conv2d(x.bfloat16(), w.bfloat16(), stride=4)`` for x of 1x3x64x4 (an output
    one column wide) differs from the float32 conv by ~3 (1.7e35 for some weights, NaN after the
    backbone) while other widths agree to bf16 rounding; ``torch.backends.mkldnn.enabled = False``
    makes it right. A reshape and a matmul never reach that kernel.
    """

    def __init__(self, in_channels: int, embed_dims: int, patch_size: HW,
                 norm_cfg: Optional[dict]):
        super().__init__()
        self.patch_size = patch_size
        self.projection = nn.Conv2d(in_channels, embed_dims, kernel_size=patch_size,
                                    stride=patch_size)
        self.norm = build_norm_layer(norm_cfg, embed_dims)[1] if norm_cfg else None

    def forward(self, x: Tensor) -> Tuple[Tensor, HW]:
        """[B, C_in, H, W] -> ([B, ceil(H/p) * ceil(W/p), C], (ceil(H/p), ceil(W/p)))."""
        (ph, pw), conv = self.patch_size, self.projection
        grid = []

        def patches(image: Tensor) -> Tensor:
            # [B, C_in, H', ph, W', pw] -> [B, H'W', C_in * ph * pw]: the conv weight's order.
            image = _corner_pad(image, self.patch_size, self.patch_size)
            b, c, h, w = image.shape
            grid[:] = [(h // ph, w // pw)]
            rows = image.view(b, c, h // ph, ph, w // pw, pw).permute(0, 2, 4, 1, 3, 5)
            return rows.reshape(b, -1, c * ph * pw).float()

        # Backward keeps the image (the caller's, alive anyway), not a copy of it as rows.
        with autocast_context(x.device.type):  # autocast off, where the device has it
            out = linear_with_recomputed_input(
                x, patches, [], conv.weight.flatten(1).float(),
                None if conv.bias is None else conv.bias.float()).to(x.dtype)
        if self.norm is not None:
            out = self.norm(out)
        return out, grid[0]


class PatchMerging(nn.Module):
    """Concatenate each 2x2 neighbourhood (channel order of ``nn.Unfold``), norm, reduce
    (SwinV2's, ``norm_after``: reduce, then norm)."""
    norm_after = False

    def __init__(self, in_channels: int, out_channels: int, stride: int = 2,
                 norm_cfg: Optional[dict] = dict(type='LN')):
        super().__init__()
        self.in_channels, self.out_channels, self.stride = in_channels, out_channels, stride
        self.norm = build_norm_layer(norm_cfg, 4 * in_channels)[1] if norm_cfg else None
        self.reduction = nn.Linear(4 * in_channels, out_channels, bias=False)
        self._kept_cast = KeptCopy()  # the reduction's cast at inference (ops/kept.py)

    def forward(self, x: Tensor, hw_shape: HW, kernels: Optional[str] = None
                ) -> Tuple[Tensor, HW]:
        """[B, H*W, C] -> ([B, H'*W', C_out], (H', W')), H' = ceil(H / stride).

        Backward keeps x, not the neighbourhoods and their norm (two tensors of x's size that
        a copy and a norm give back): x is the stage output, which the output norm keeps.
        ``kernels``: as ``SwinBlock.forward``'s (``ops.block.patch_merge``)."""
        norm, after = self.norm, self.norm_after
        if kernels and self.stride == 2 and (after or is_layer_norm(norm)) \
                and not is_compiling():
            h, w = hw_shape
            weight = self.reduction.weight
            dtype = compute_dtype(x)
            if dtype != weight.dtype and not torch.is_grad_enabled():  # inference, autocast
                weight = self._kept_cast.get(sources_key((weight,), dtype),
                                             lambda: weight.detach().to(dtype))
            out = patch_merge(x, hw_shape, None if after else (norm.weight, norm.bias, norm.eps),
                              weight, KERNELS[kernels])
            hw_shape = ((h + 1) // 2, (w + 1) // 2)
        else:
            prefix = norm if norm is not None and not after else _IDENTITY
            out, hw_shape = self.reduce(x, hw_shape, prefix, affine_tensors(prefix))
        return (norm(out) if after and norm is not None else out), hw_shape

    def reduce(self, x: Tensor, hw_shape: HW, prefix: nn.Module,
               prefix_params: list) -> Tuple[Tensor, HW]:
        """``reduction(prefix(neighbourhoods(x)))``, the neighbourhoods and ``prefix``
        recomputed in backward from x."""
        merged_hw = []

        def merge(t: Tensor) -> Tensor:
            t, hw = self.neighbourhoods(t, hw_shape)
            merged_hw[:] = [hw]
            return prefix(t)

        out = linear_with_recomputed_input(x, merge, prefix_params, self.reduction.weight,
                                           None)
        return out, merged_hw[0]

    def neighbourhoods(self, x: Tensor, hw_shape: HW) -> Tuple[Tensor, HW]:
        """[B, H*W, C] -> ([B, H'*W', 4C] concatenated 2x2 neighbourhoods, (H', W'))."""
        b, _, c = x.shape
        h, w = hw_shape
        s = self.stride
        if s == 2:  # the common case: a reshape gives nn.Unfold's (c, ky, kx) order, no copy loop
            x = x.view(b, h, w, c)
            if is_tracing(x) or h % 2 or w % 2:
                x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
            hh, ww = x.shape[1] // 2, x.shape[2] // 2
            x = x.view(b, hh, 2, ww, 2, c).permute(0, 1, 3, 5, 2, 4).reshape(b, hh * ww, 4 * c)
        else:
            x = x.transpose(1, 2).reshape(b, c, h, w)
            x = _corner_pad(x, (2, 2), (s, s))
            hh, ww = (x.shape[2] - 2) // s + 1, (x.shape[3] - 2) // s + 1
            x = F.unfold(x, kernel_size=2, stride=s).transpose(1, 2)
        return x, (hh, ww)


class WindowMSA(nn.Module):
    """Multi-head self-attention inside windows, with a 2D relative position bias table."""

    def __init__(self, embed_dims: int, num_heads: int, window_size, qkv_bias: bool = True,
                 qk_scale: Optional[float] = None, attn_drop_rate: float = 0.,
                 proj_drop_rate: float = 0., fused_attention: bool = True):
        super().__init__()
        self.window_size = to_window_tuple(window_size)
        self.num_heads = num_heads
        self.scale = qk_scale or (embed_dims // num_heads) ** -0.5
        self.attn_drop_rate = attn_drop_rate
        self.fused_attention = fused_attention
        # Derived from the window size, so never saved and never read from a checkpoint.
        self.register_buffer('relative_position_index',
                             relative_position_index(self.window_size), persistent=False)
        # Cosine attention's learned logit scale (SwinV2's parameter); None: dot products.
        self.logit_scale = None
        self.init_position_bias()
        self.qkv = nn.Linear(embed_dims, embed_dims * 3, bias=qkv_bias)
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop_rate)
        self._kept_bias = KeptCopy()  # the inference bias (ops/kept.py)

    def init_position_bias(self) -> None:
        """Create the parameters of the bias source (V1: the table; SwinV2 overrides)."""
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros(table_rows(self.window_size), self.num_heads))

    def reset_parameters(self) -> None:
        """The reference init of what is not a Linear: the table truncated normal (std 0.02)."""
        trunc_normal_(self.relative_position_bias_table, std=0.02)

    def qkv_projection_bias(self) -> Optional[Tensor]:
        """Bias of the qkv projection [3C] (SwinV2 overrides: no bias on k)."""
        return self.qkv.bias

    def qkv_bias_sources(self) -> list:
        """The parameters :meth:`qkv_projection_bias` is made of."""
        return [self.qkv.bias]

    def query_key(self, q: Tensor, k: Tensor) -> Tuple[Tensor, Tensor, float]:
        """(q, k, logit scale) as attention takes them (SwinV2 overrides: cosine attention);
        ``analysis/rpe_plots.py`` reproduces a block's attention through it."""
        return q, k, self.scale

    def relative_position_bias(self, tracing: Optional[bool] = None,
                               contiguous: bool = True) -> Tensor:
        """[heads, N, N] bias gathered from the table.

        Reused across forwards while the table is unchanged and no gradient is needed
        (inference); recomputed whenever autograd must see the gather, and under
        torch.compile (which fuses the gather instead). ``tracing``: whether a tracer or
        compiler runs, if the caller knows (None: asked here); ``contiguous``: as
        ``gather_relative_position_bias`` (a recomputed bias only).
        """
        table, index = self.relative_position_bias_table, self.relative_position_index
        if tracing is None:
            tracing = is_tracing(table)
        if (torch.is_grad_enabled() and table.requires_grad) or tracing:
            return gather_relative_position_bias(table, index, contiguous)
        return self._kept_bias.get(sources_key((table,), table.dtype, table.device),
                                   lambda: gather_relative_position_bias(table.detach(), index))

    def attention(self, qkv: Tensor, mask: Optional[Tensor] = None,
                  windows_per_image: Optional[int] = None) -> Tensor:
        """Attention before the output projection: [B * nW, N, 3C] -> [B * nW, N, C]. q, k
        and v are the projection's own columns, so the attention takes it packed (and writes
        its gradient in its layout); SwinV2's cosine attention by its ``logit_scale``."""
        return window_attention_qkv(qkv, self.num_heads, self.relative_position_bias(), mask,
                                    self.scale, self.attn_drop_rate if self.training else 0.0,
                                    fused=self.fused_attention,
                                    windows_per_image=windows_per_image,
                                    logit_scale=self.logit_scale)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # mmdet/mmseg/official checkpoints save the index; ours is rebuilt from the window.
        state_dict.pop(prefix + 'relative_position_index', None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class ShiftWindowMSA(nn.Module):
    """Pad, cyclic shift, window attention, reverse shift, crop; then drop path."""

    def __init__(self, embed_dims: int, num_heads: int, window_size, shift_size=0,
                 qkv_bias: bool = True, qk_scale: Optional[float] = None,
                 attn_drop_rate: float = 0., proj_drop_rate: float = 0.,
                 dropout_layer: Optional[dict] = None, fused_attention: bool = True,
                 w_msa: Optional[WindowMSA] = None):
        """``w_msa``: a window attention built by the caller (SwinV2's); the attention
        arguments above are then unused."""
        super().__init__()
        self.window_size = to_window_tuple(window_size)
        shift = (shift_size, shift_size) if isinstance(shift_size, int) else tuple(shift_size)
        if not all(0 <= s < m for s, m in zip(shift, self.window_size)):
            raise ValueError(f'shift_size must be in [0, window) per side, got {shift_size!r} '
                             f'for window {self.window_size}')
        self.shift_size = shift
        self.w_msa = w_msa if w_msa is not None else WindowMSA(
            embed_dims, num_heads, self.window_size, qkv_bias, qk_scale, attn_drop_rate,
            proj_drop_rate, fused_attention)
        self.drop = build_dropout(dropout_layer or dict(type='DropPath', drop_prob=0.))

    def plan(self, hw_shape: HW, valid_hw: Optional[HW], like: Tensor) -> WindowPlan:
        """The window plan of this block's shift for an H x W map of tensors like ``like``.

        Cached per size in eager mode; under tracers and exporters computed from the (symbolic)
        sizes instead (``traceable_window_plan``), one (h, w) region for every image.
        """
        if is_tracing(like) and not plan_outside_graph():
            return traceable_window_plan(hw_shape, self.window_size, self.shift_size, valid_hw,
                                         like.device)
        return cached_window_plan(tuple(hw_shape), self.window_size, self.shift_size,
                                  None if valid_hw is None else tuple(valid_hw), like.device,
                                  torch.float32)

    def forward(self, query: Tensor, hw_shape: HW, plan: Optional[WindowPlan] = None,
                post_norm: Optional[nn.Module] = None) -> Tensor:
        """query: [B, H*W, C] -> the attention branch [B, H*W, C] (drop path applied), as
        mmdet's ``ShiftWindowMSA``: the block's plain form adds it to the residual.

        Args:
            plan: from :meth:`plan` (built here if None).
            post_norm: applied to the attention output before drop path (res-post-norm).
        """
        b, length, c = query.shape
        h, w = hw_shape
        if not is_tracing(query) and length != h * w:
            raise ValueError(f'query has {length} tokens but hw_shape {hw_shape} needs {h * w}')
        if plan is None:
            plan = self.plan(hw_shape, None, query)
        n = self.window_size[0] * self.window_size[1]
        index, zeros = plan.window_index()
        w_msa = self.w_msa
        # Pad, roll and partition in one gather; padding is zero tokens, as the reference pads
        # after the norm.
        windows = gather_tokens(query, index, plan.scatter, zeros, False).view(-1, n, c)
        qkv = linear(windows, w_msa.qkv.weight, w_msa.qkv_projection_bias())
        windows = w_msa.attention(qkv, plan.mask, plan.num_windows)
        # Tokens back in map order before the projection (a per-token map, so the order is
        # free): padding is dropped first.
        x = gather_tokens(windows.view(b, -1, c), plan.scatter, index, False, zeros)
        x = w_msa.proj_drop(linear(x, w_msa.proj.weight, w_msa.proj.bias))
        return self.drop(x if post_norm is None else post_norm(x))


class FFN(nn.Module):
    """fc1 -> act -> dropout -> fc2 -> dropout, then drop path and the residual.

    The module and parameter names of mmcv's ``FFN`` (``layers.0.0``, ``layers.1``), so
    checkpoints match.
    """

    def __init__(self, embed_dims: int, feedforward_channels: int, act_cfg: dict,
                 ffn_drop: float = 0., dropout_layer: Optional[dict] = None):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Sequential(nn.Linear(embed_dims, feedforward_channels),
                          build_activation_layer(act_cfg), nn.Dropout(ffn_drop)),
            nn.Linear(feedforward_channels, embed_dims), nn.Dropout(ffn_drop))
        self.dropout_layer = build_dropout(dropout_layer or dict(type='DropPath', drop_prob=0.))
        self.ffn_drop = ffn_drop
        # mmcv's FFN attributes, read by stock code and mmdet's own tests
        self.embed_dims, self.feedforward_channels = embed_dims, feedforward_channels
        self.num_fcs, self.act_cfg, self.add_identity = 2, act_cfg, True

    def forward(self, x: Tensor, identity: Tensor,
                post_norm: Optional[nn.Module] = None) -> Tensor:
        """x: [B, L, C] (the norm's output, or the block's for SwinV2); identity: the residual.

        post_norm: applied to the FFN output before drop path (res-post-norm).
        """
        # indexed, not unpacked: dynamo on torch 2.1 breaks its graph on unpacking a module
        first, fc2, drop2 = self.layers[0], self.layers[1], self.layers[2]
        fc1, act, drop1 = first[0], first[1], first[2]
        if not torch.is_grad_enabled() and _is_exact_gelu(act) and not (
                drop1.training and drop1.p):
            hidden = linear(x, fc1.weight, fc1.bias, gelu=True)  # GELU in the product's epilogue
        else:
            hidden = drop1(act(linear(x, fc1.weight, fc1.bias)))
        out = drop2(linear(hidden, fc2.weight, fc2.bias))
        return identity + self.dropout_layer(out if post_norm is None else post_norm(out))


# A patch merging's absent prefix: one shared module (dynamo on torch 2.1 breaks its graph on a
# module built in forward).
_IDENTITY = nn.Identity()


def _is_exact_gelu(act: nn.Module) -> bool:
    return type(act) is nn.GELU and act.approximate == 'none'


class SwinBlock(nn.Module):
    """norm -> (S)W-MSA -> residual -> norm -> FFN -> residual.

    With ``post_norm`` (SwinV2's res-post-norm): (S)W-MSA -> norm -> residual -> FFN -> norm ->
    residual. ``attention_options``: further arguments of the window attention.
    """
    # The window attention this block class builds, which ops.block's halves compute.
    window_attention_class = WindowMSA
    post_norm = False

    def __init__(self, embed_dims: int, num_heads: int, feedforward_channels: int,
                 window_size=7, shift: bool = False, qkv_bias: bool = True,
                 qk_scale: Optional[float] = None, drop_rate: float = 0.,
                 attn_drop_rate: float = 0., drop_path_rate: float = 0.,
                 act_cfg: Optional[dict] = None, norm_cfg: Optional[dict] = None,
                 with_cp: bool = False, fused_attention: bool = True, **attention_options):
        super().__init__()
        window = to_window_tuple(window_size)
        self.with_cp = with_cp
        self.shift_size = (window[0] // 2, window[1] // 2) if shift else (0, 0)
        norm_cfg = norm_cfg or dict(type='LN')
        drop_path = dict(type='DropPath', drop_prob=drop_path_rate)
        self.norm1 = build_norm_layer(norm_cfg, embed_dims)[1]
        w_msa = self.window_attention_class(embed_dims, num_heads, window, qkv_bias, qk_scale,
                                            attn_drop_rate, drop_rate, fused_attention,
                                            **attention_options)
        self.attn = ShiftWindowMSA(embed_dims, num_heads, window, self.shift_size,
                                   dropout_layer=drop_path, w_msa=w_msa)
        self.norm2 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.ffn = FFN(embed_dims, feedforward_channels, act_cfg or dict(type='GELU'),
                       drop_rate, drop_path)
        self._kept_casts = KeptCopy()  # the linears' casts at inference (ops/kept.py)

    def forward(self, x: Tensor, hw_shape: HW, plan: Optional[WindowPlan] = None,
                kernels: Optional[str] = None) -> Tensor:
        """x: [B, H*W, C] -> [B, H*W, C].

        ``kernels``: the backbone's choice for this forward (``ops.dispatch.block_kernels``:
        'cpu' or 'generic'), with which the block runs ``ops.block``'s two halves, its one
        definition (V1 and SwinV2, dropout, drop path), with the plan given; None (tracers,
        exporters, compilers) or a block the halves do not compute (other norms or
        activations, the explicit attention) runs the modules' plain form. Asked again here whether a compiler
        traces this call: torch 2.1's dynamo runs a frame eagerly after a graph break in its
        loop and traces the frames it calls, so a stage's answer can be an eager one.

        A forward hook (or pre-hook) on ``norm1``, ``attn``, ``norm2`` or ``ffn`` sends the
        block through its module form on every path, which calls them in mmdet's order with
        mmdet's inputs and outputs (docs/backbone.md).

        ``with_cp``: each half (attention, FFN) is checkpointed on its own, so backward holds
        one half's recomputed activations at a time, not the block's (docs/training.md)."""
        norm1, attn, norm2, ffn = self.norm1, self.attn, self.norm2, self.ffn
        arguments = None
        if kernels and not has_forward_hooks(norm1, attn, norm2, ffn) and not is_compiling():
            arguments = self.half_arguments(x, plan, KERNELS[kernels], norm1, attn, norm2, ffn)
        if arguments is not None:  # the halves and their arguments after x
            first_half, second_half = attention_half, ffn_half
            first_args, second_args = arguments
        else:
            first_args = second_args = ()
            if self.post_norm:
                def first_half(x: Tensor) -> Tensor:
                    return x + attn(x, hw_shape, plan, post_norm=norm1)

                def second_half(x: Tensor) -> Tensor:
                    return ffn(x, identity=x, post_norm=norm2)
            else:  # mmdet's module order: what a hook on a part sees is what it sees there
                def first_half(x: Tensor) -> Tensor:
                    return x + attn(norm1(x), hw_shape, plan)

                def second_half(x: Tensor) -> Tensor:
                    return ffn(norm2(x), identity=x)

        if self.with_cp and torch.is_grad_enabled() and (
                x.requires_grad or any(p.requires_grad for p in self.parameters())):
            x = cp.checkpoint(first_half, x, *first_args, use_reentrant=False)
            return cp.checkpoint(second_half, x, *second_args, use_reentrant=False)
        return second_half(first_half(x, *first_args), *second_args)

    def half_arguments(self, x: Tensor, plan: WindowPlan, kernels, norm1: nn.Module,
                       attn: nn.Module, norm2: nn.Module, ffn: nn.Module) -> Optional[tuple]:
        """The arguments after x of ``ops.block.attention_half`` and ``ffn_half`` (see there)
        with ``kernels``, when this block is one they compute: its own window attention
        (``window_attention_class``, fused), LayerNorms, exact GELU, mmcv's drop path, one
        FFN dropout; else None. Read through the modules' attributes at each call, so a
        swapped module, or a parameter a wrapper replaced (FSDP's views), is seen as it is
        now. At inference under autocast the linears' casts are the last call's while their
        weights are unchanged (``ops/kept.py``)."""
        w_msa, drop_attn, drop_ffn = attn.w_msa, attn.drop, ffn.dropout_layer
        (fc1, act, drop1), fc2, drop2 = ffn.layers
        # Written out, not by is_layer_norm / _is_exact_gelu: each call is host
        # time a GPU waits for, twelve blocks a forward (tests/benchmarks/test_host_budgets.py).
        if not (type(w_msa) is self.window_attention_class and w_msa.fused_attention
                and type(norm1) is nn.LayerNorm and type(norm2) is nn.LayerNorm
                and norm1.normalized_shape[-1:] == norm1.normalized_shape
                and norm2.normalized_shape[-1:] == norm2.normalized_shape
                and type(act) is nn.GELU and act.approximate == 'none'
                and type(drop_attn) in _DROP_PATHS and type(drop_ffn) in _DROP_PATHS):
            return None
        if self.training:
            if drop1.p != drop2.p:  # the halves take one FFN dropout
                return None
            dropouts = (w_msa.attn_drop_rate, w_msa.proj_drop.p, drop1.p)
            drop_attn = drop_attn.drop_prob if type(drop_attn) is DropPath \
                and drop_attn.training else 0.
            drop_ffn = drop_ffn.drop_prob if type(drop_ffn) is DropPath \
                and drop_ffn.training else 0.
        else:
            dropouts, drop_attn, drop_ffn = (0., 0., 0.), 0., 0.
        qkv, proj = w_msa.qkv, w_msa.proj
        linears = [qkv.weight, w_msa.qkv_projection_bias(), proj.weight, proj.bias, fc1.weight,
                   fc1.bias, fc2.weight, fc2.bias]
        if not torch.is_grad_enabled():
            dtype = compute_dtype(x)
            if dtype != linears[0].dtype:  # inference under autocast: the last call's casts
                # keyed by what the qkv bias is made of (SwinV2 makes it at each call)
                linears = self._kept_casts.get(
                    sources_key(linears[:1] + linears[2:] + w_msa.qkv_bias_sources(), dtype),
                    lambda: [None if t is None else t.detach().to(dtype) for t in linears])
        # The generic kernels broadcast the gathered bias as it is (a permuted view).
        bias = w_msa.relative_position_bias(False, kernels.name != 'generic')
        post_norm = self.post_norm
        return ((plan, w_msa.num_heads, w_msa.scale, bias, (norm1.weight, norm1.bias, norm1.eps),
                 linears[0:2], linears[2:4], drop_attn, kernels, post_norm,
                 w_msa.logit_scale, dropouts[0], dropouts[1]),
                ((norm2.weight, norm2.bias, norm2.eps), linears[4:6], linears[6:8], drop_ffn,
                 kernels, post_norm, dropouts[2]))


# mmcv's drop path (and the identity it is at rate 0): what ops.block draws itself
_DROP_PATHS = (DropPath, nn.Identity)
