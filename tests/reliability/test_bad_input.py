"""Clear errors: every bad input of docs/reliability-and-security.md's table raises ValueError/TypeError
whose message names the offending argument (and its value or shape).

tests/models/test_backbone.py already covers the README's constructor rows (window_size 0,
embed dims not divisible, depths/num_heads lengths, out_indices, patch_size, frozen_stages,
pretrained) and the 3-D / wrong-channel input; these are the rest.
"""
import re

import pytest
import torch

from swin_rpe_plugin import SwinTransformer
from swin_rpe_plugin.models.layers import ShiftWindowMSA
from swin_rpe_plugin.ops import (gather_relative_position_bias, pad_to_window,
                                 padding_key_mask, relative_position_index,
                                 resize_relative_position_bias_table, shift_attention_mask,
                                 window_attention, window_partition, window_plan)

TINY = dict(embed_dims=8, depths=(2, 2), num_heads=(1, 2), strides=(4, 2), window_size=3,
            out_indices=(0, 1), drop_path_rate=0.0)


def raises(exc, pattern, fn):
    with pytest.raises(exc) as info:
        fn()
    assert re.search(pattern, str(info.value)), f'message {str(info.value)!r} lacks {pattern!r}'


# ---- backbone constructor ---------------------------------------------------------------

@pytest.mark.parametrize('kwargs,exc,pattern', [
    (dict(window_size=2.5), TypeError, r'window_size .*got 2\.5'),
    (dict(window_size=(2.5, 3)), ValueError, r'window_size .*got \(2\.5, 3\)'),
    (dict(window_size=True), TypeError, r'window_size .*got True'),
    (dict(window_size=(2, 2, 2)), ValueError, r'window_size .*\(2, 2, 2\)'),
    (dict(embed_dims=0), ValueError, r'embed_dims must be a positive int, got 0'),
    (dict(in_channels=0), ValueError, r'in_channels must be a positive int, got 0'),
    (dict(strides=(4, 2, 2)), ValueError, r'strides \(4, 2, 2\) must have one entry per stage'),
    (dict(depths=(2, 0)), ValueError, r'depths\[1\]=0'),
    (dict(num_heads=(1, 0)), ValueError, r'num_heads\[1\]=0'),
    (dict(out_indices=(-1, )), ValueError, r'out_indices \(-1,\): index -1'),
    (dict(pretrain_img_size=0), ValueError, r'pretrain_img_size must be >= 1'),
    (dict(frozen_stages=-2), ValueError, r'frozen_stages=-2'),
])
def test_constructor_names_the_argument(kwargs, exc, pattern):
    raises(exc, pattern, lambda: SwinTransformer(**{**TINY, **kwargs}))


# Accepted silently (or failing later, unnamed) before the lead's a6c99fb.
@pytest.mark.parametrize('kwargs,exc,pattern', [
    (dict(mlp_ratio=0), ValueError, r'mlp_ratio must be a positive number, got 0'),
    (dict(mlp_ratio=-1), ValueError, r'mlp_ratio must be a positive number, got -1'),
    (dict(drop_path_rate=1.5), ValueError, r'drop_path_rate must be in \[0, 1\), got 1\.5'),
    (dict(attn_drop_rate=2.0), ValueError, r'attn_drop_rate must be in \[0, 1\), got 2\.0'),
    (dict(drop_rate=1.0), ValueError, r'drop_rate must be in \[0, 1\), got 1\.0'),
    (dict(strides=(4, 0)), ValueError, r'strides \(4, 0\) must all be >= 1'),
    (dict(depths=2, num_heads=1), TypeError, r'depths must be a sequence, got 2'),
])
def test_constructor_rates_ratios_and_types(kwargs, exc, pattern):
    raises(exc, pattern, lambda: SwinTransformer(**{**TINY, **kwargs}))


def test_init_cfg_checkpoint_that_does_not_exist_is_named():
    model = SwinTransformer(**TINY, init_cfg=dict(type='Pretrained', checkpoint='/nope/x.pth'))
    raises(FileNotFoundError, r"checkpoint not found: '/nope/x\.pth'", model.init_weights)


# ---- backbone forward -------------------------------------------------------------------

def test_input_that_is_not_a_tensor_is_named():
    raises(ValueError, r'input must be a 4-D tensor \[B, C, H, W\], got list',
           lambda: SwinTransformer(**TINY)([torch.zeros(1, 3, 32, 32)]))


@pytest.mark.parametrize('shape', [(1, 3, 0, 32), (1, 3, 32, 0), (0, 3, 32, 32)])
def test_empty_input_is_named(shape):
    raises(ValueError, re.escape(f'input {shape} is empty'),
           lambda: SwinTransformer(**TINY).eval()(torch.zeros(shape)))


def test_integer_input_is_named():
    raises(TypeError, r'input must be a floating-point tensor, got torch\.uint8',
           lambda: SwinTransformer(**TINY)(torch.zeros(1, 3, 32, 32, dtype=torch.uint8)))


def test_block_refuses_tokens_that_do_not_fit_the_map():
    block = ShiftWindowMSA(8, 1, 3, 1)
    raises(ValueError, r'query has 10 tokens but hw_shape \(3, 4\) needs 12',
           lambda: block(torch.zeros(1, 10, 8), (3, 4)))
    raises(ValueError, r'shift_size must be in \[0, window\).*got 3 for window \(3, 3\)',
           lambda: ShiftWindowMSA(8, 1, 3, 3))


# ---- functional core --------------------------------------------------------------------

Q = torch.zeros(4, 2, 9, 4)


@pytest.mark.parametrize('fn,exc,pattern', [
    (lambda: gather_relative_position_bias(torch.zeros(9), relative_position_index(2)),
     ValueError, r'table must be 2-D \[rows, heads\], got shape \(9,\)'),
    (lambda: gather_relative_position_bias(torch.zeros(9, 2), relative_position_index(3)),
     ValueError, r'index refers to row 24 but table has 9 rows'),
    (lambda: resize_relative_position_bias_table(torch.zeros(9, 1), 2, 3, mode='nearest'),
     ValueError, r"mode must be 'bicubic' or 'bilinear', got 'nearest'"),
    (lambda: resize_relative_position_bias_table(torch.zeros(10, 1), 2, 3),
     ValueError, r'table of shape \(10, 1\) is not a bias table for window \(2, 2\)'),
    (lambda: resize_relative_position_bias_table(torch.zeros(9, 1), 2, 0),
     ValueError, r'new_window must be >= 1'),
    (lambda: pad_to_window(torch.zeros(3, 4, 5), 2),
     ValueError, r'x must be \[B, H, W, C\], got shape \(3, 4, 5\)'),
    (lambda: window_partition(torch.zeros(3, 4, 5), 2),
     ValueError, r'x must be \[B, H, W, C\], got shape \(3, 4, 5\)'),
    (lambda: shift_attention_mask((4, 4), 2, -1),
     ValueError, r'shift_size must be in \[0, window\).*got -1'),
    (lambda: shift_attention_mask((4, 4), 2, (1, 1, 1)),
     ValueError, r'shift_size .*got \(1, 1, 1\)'),
    (lambda: shift_attention_mask((5, 4), 2, 1),
     ValueError, r'padded_hw \(5, 4\) is not a multiple'),
    (lambda: padding_key_mask((4, 4), (5, 1), 2),
     ValueError, r'valid_hw \(5, 1\) must lie inside padded_hw \(4, 4\)'),
    (lambda: padding_key_mask((4, 4), (-1, 1), 2),
     ValueError, r'valid_hw \(-1, 1\) must lie inside'),
    (lambda: window_plan((5, 5), 2, (2, 0)),
     ValueError, r'shift_size .*got \(2, 0\) for window \(2, 2\)'),
    (lambda: window_plan((5, 5), 2, (1, 1), (7, 1)),
     ValueError, r'valid_hw \(7, 1\) must lie inside padded_hw \(6, 6\)'),
    (lambda: window_attention(Q, Q, Q, torch.zeros(2, 8, 8)),
     ValueError, r'bias must be \[heads=2, N=9, N=9\], got \(2, 8, 8\)'),
    (lambda: window_attention(Q, Q, Q, torch.zeros(2, 9, 9), torch.zeros(3, 9, 9)),
     ValueError, r'mask of shape \(3, 9, 9\) does not fit 4 windows'),
    (lambda: window_attention(Q, Q, Q, torch.zeros(2, 9, 9), torch.zeros(1, 9, 9),
                              windows_per_image=3),
     ValueError, r'mask of shape \(1, 9, 9\) does not fit 4 windows of 9 tokens, 3 per image'),
], ids=['table-1d', 'table-rows', 'resize-mode', 'resize-table', 'resize-window', 'pad-3d',
        'partition-3d', 'shift-negative', 'shift-3', 'mask-padded-hw',
        'valid-outside', 'valid-negative', 'plan-shift', 'plan-valid', 'attention-bias',
        'attention-mask', 'attention-windows-per-image'])
def test_functional_core_names_the_argument(fn, exc, pattern):
    raises(exc, pattern, fn)
