"""The checks of mmdet's and mmseg's own Swin backbone unit tests, run on our backbone.

Sources: ``tests/test_models/test_backbones/test_swin.py`` of open-mmlab/mmdetection (v3.x:
``test_swin_block``, ``test_swin_transformer``) and of open-mmlab/mmsegmentation (v1.x:
``test_swin_transformer``). Their files are not copied here (this project commits no code of
other repositories); every check they make is restated below, one case each, and where it
helps the stock class runs beside ours as the reference. Run verbatim with only the import
changed, they pass against ``swin_rpe_plugin`` except where they expect an exception *type*:

- stock raises ``AssertionError`` for ``strides[0] != patch_size`` and for a 3-tuple
  ``pretrain_img_size``; ours raises a named ``ValueError`` (asserts vanish under ``python -O``);
- stock raises ``TypeError`` for ``pretrained=123``; ours does too.

Two differences these checks found, both fixed: mmcv's ``FFN`` attributes that stock code
reads (``block.ffn.embed_dims``, ``feedforward_channels``) and mmseg's 1-tuple form
``pretrain_img_size=(224,)``.
"""
import pytest
import torch
from mmdet.models.backbones.swin import SwinBlock as StockBlock
from mmdet.models.backbones.swin import SwinTransformer as MMDetSwin
from mmseg.models.backbones import SwinTransformer as MMSegSwin

from swin_rpe_plugin import SwinTransformer
from swin_rpe_plugin.models.layers import SwinBlock

TOOLKITS = {'mmdet': MMDetSwin, 'mmseg': MMSegSwin}


@pytest.mark.parametrize('with_cp', [False, True])
def test_swin_block_structure_and_forward(with_cp):
    """mmdet ``test_swin_block``: attributes stock code reads, (B, L, C) in and out."""
    kwargs = dict(embed_dims=64, num_heads=4, feedforward_channels=256, with_cp=with_cp)
    ours, stock = SwinBlock(**kwargs), StockBlock(**kwargs)
    for block in (ours, stock):
        assert block.ffn.embed_dims == 64
        assert block.attn.w_msa.num_heads == 4
        assert block.ffn.feedforward_channels == 256
        assert block.with_cp is with_cp
    x = torch.randn(1, 56 * 56, 64)
    assert ours(x, (56, 56)).shape == stock(x, (56, 56)).shape == (1, 56 * 56, 64)


@pytest.mark.parametrize('toolkit', list(TOOLKITS))
def test_bad_arguments_raise(toolkit):
    stock = TOOLKITS[toolkit]
    with pytest.raises(TypeError):  # pretrained must be str or None
        stock(pretrained=123)
    with pytest.raises(TypeError):
        SwinTransformer(pretrained=123)
    # Non-overlapping patch embedding: strides[0] must equal patch_size. Stock: AssertionError.
    with pytest.raises(AssertionError):
        stock(strides=(2, 2, 2, 2), patch_size=4)
    with pytest.raises(ValueError, match='patch_size 4 must equal strides'):
        SwinTransformer(strides=(2, 2, 2, 2), patch_size=4)
    with pytest.raises(AssertionError):  # a 3-tuple image size
        stock(pretrain_img_size=(224, 224, 224))
    with pytest.raises(ValueError, match='pretrain_img_size must be an int or a pair'):
        SwinTransformer(pretrain_img_size=(224, 224, 224))


def test_one_tuple_pretrain_img_size_means_square():
    """mmseg: ``pretrain_img_size=(224,)`` is accepted (as 224 x 224)."""
    MMSegSwin(pretrain_img_size=(224, ))
    assert SwinTransformer(pretrain_img_size=(224, )).pretrain_img_size == (224, 224)


@pytest.mark.parametrize('kwargs', [dict(pretrain_img_size=224, use_abs_pos_embed=True),
                                    dict(patch_norm=False)], ids=['abs_pos_embed', 'no_patch_norm'])
def test_options_run(kwargs):
    model = SwinTransformer(**kwargs)
    model.init_weights()
    outs = model(torch.randn(1, 3, 224, 224))
    assert [o.shape for o in outs] == [(1, 96, 56, 56), (1, 192, 28, 28), (1, 384, 14, 14),
                                       (1, 768, 7, 7)]


@pytest.mark.parametrize('hw,grids', [((512, 512), [128, 64, 32, 16]),
                                      ((511, 511), [128, 64, 32, 16]),
                                      ((112, 137), [(28, 35), (14, 18), (7, 9), (4, 5)])])
def test_output_shapes_match_the_toolkits(hw, grids):
    """Normal and abnormal sizes: the shapes the stock tests assert, and the stock model's."""
    x = torch.randn(1, 3, *hw)
    with torch.no_grad():
        ours = [tuple(o.shape) for o in SwinTransformer()(x)]
        stock = [tuple(o.shape) for o in MMDetSwin()(x)]
    grids = [g if isinstance(g, tuple) else (g, g) for g in grids]
    assert ours == stock == [(1, 96 * 2 ** i, *g) for i, g in enumerate(grids)]


def test_frozen_stages_freeze_everything():
    model = SwinTransformer(frozen_stages=4)
    model.train()
    assert not any(p.requires_grad for p in model.parameters())
