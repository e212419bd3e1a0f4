"""Resolution transfer at load time and on a live model, against plain F.interpolate."""
import os

import pytest
import torch
import torch.nn.functional as F

from swin_rpe_plugin import SwinTransformer
from swin_rpe_plugin.checkpoint import load_pretrained, set_window_size
from swin_rpe_plugin.ops import relative_position_index
from conftest import ROOT

TIMM_W7 = os.path.join(ROOT, 'tests', 'fixtures', 'swin', 'timm_tiny.safetensors')
TIMM_W7_EMBED = 8  # the configuration of the committed fixtures
TABLE = 'stages.{s}.blocks.{b}.attn.w_msa.relative_position_bias_table'


def tiny(window, embed_dims=16, **kwargs):
    return SwinTransformer(embed_dims=embed_dims, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8),
                           window_size=window, drop_path_rate=0.0, **kwargs).eval()


def interpolate_table(table, old, new, mode='bicubic'):
    """Independent reference: the table as a per-head (2Mh-1) x (2Mw-1) image."""
    heads = table.shape[1]
    img = table.t().reshape(1, heads, 2 * old[0] - 1, 2 * old[1] - 1)
    img = F.interpolate(img, size=(2 * new[0] - 1, 2 * new[1] - 1), mode=mode,
                        align_corners=False)
    return img.reshape(heads, -1).t()


def saved(tmp_path, model, name='ckpt.pth'):
    path = str(tmp_path / name)
    torch.save({'state_dict': model.state_dict()}, path)
    return path


@pytest.mark.parametrize('new,mode', [(12, 'bicubic'), (12, 'bilinear'), ((7, 12), 'bicubic'),
                                      (7, 'bicubic')])
def test_tables_resized_on_load_equal_interpolate(tmp_path, new, mode):
    source = tiny(7)
    source.init_weights()
    path = saved(tmp_path, source)
    target = tiny(new)
    report = load_pretrained(target, path, mode=mode)
    new_hw = (new, new) if isinstance(new, int) else new
    for s in range(4):
        for b in range(2):
            key = TABLE.format(s=s, b=b)
            old_table = source.state_dict()[key]
            got = target.state_dict()[key]
            if new_hw == (7, 7):
                assert torch.equal(got, old_table) and key not in report.resized
            else:
                ref = interpolate_table(old_table, (7, 7), new_hw, mode)
                assert got.shape == ref.shape
                assert torch.allclose(got, ref, atol=1e-6)
                assert report.resized[key] == (tuple(old_table.shape), tuple(ref.shape))


def test_rectangular_source_window_needs_to_be_named(tmp_path):
    source = tiny((7, 12))
    source.init_weights()
    path = saved(tmp_path, source)
    with pytest.raises(ValueError, match='src_window'):
        load_pretrained(tiny(7), path)
    target = tiny(7)
    load_pretrained(target, path, src_window=(7, 12))
    key = TABLE.format(s=1, b=1)
    ref = interpolate_table(source.state_dict()[key], (7, 12), (7, 7))
    assert torch.allclose(target.state_dict()[key], ref, atol=1e-6)


def test_absolute_position_embedding_224_to_384(tmp_path):
    source = tiny(7, use_abs_pos_embed=True, pretrain_img_size=224)
    source.init_weights()
    path = saved(tmp_path, source)
    target = tiny(12, use_abs_pos_embed=True, pretrain_img_size=384)
    report = load_pretrained(target, path)
    old = source.absolute_pos_embed  # [1, 56*56, 16]
    ref = F.interpolate(old.reshape(1, 56, 56, 16).permute(0, 3, 1, 2), size=(96, 96),
                        mode='bicubic', align_corners=False).flatten(2).transpose(1, 2)
    assert torch.allclose(target.absolute_pos_embed, ref, atol=1e-6)
    assert report.resized['absolute_pos_embed'] == ((1, 3136, 16), (1, 9216, 16))
    same = tiny(7, use_abs_pos_embed=True, pretrain_img_size=224)
    load_pretrained(same, path)
    assert torch.equal(same.absolute_pos_embed, old)


@pytest.mark.parametrize('new', [12, (7, 12)])
def test_live_window_change_equals_a_model_built_and_loaded_at_that_window(new):
    live = tiny(7, embed_dims=TIMM_W7_EMBED)
    load_pretrained(live, TIMM_W7)
    resized = set_window_size(live, new)
    fresh = tiny(new, embed_dims=TIMM_W7_EMBED)
    load_pretrained(fresh, TIMM_W7)
    new_hw = (new, new) if isinstance(new, int) else new
    assert len(resized) == 8
    assert live.window_size == new_hw
    for stage in live.stages:
        assert stage.window_size == new_hw
        for b, block in enumerate(stage.blocks):
            shift = (new_hw[0] // 2, new_hw[1] // 2) if b % 2 else (0, 0)
            assert block.shift_size == block.attn.shift_size == shift
            assert block.attn.window_size == block.attn.w_msa.window_size == new_hw
            assert torch.equal(block.attn.w_msa.relative_position_index,
                               relative_position_index(new_hw))
    fresh_state = fresh.state_dict()
    for key, value in live.state_dict().items():
        assert torch.allclose(value, fresh_state[key], atol=1e-6), key
    x = torch.randn(1, 3, 160, 200)
    with torch.no_grad():
        for a, b in zip(live(x), fresh(x)):
            assert torch.allclose(a, b, atol=1e-5)
    assert all(isinstance(p, torch.nn.Parameter) for p in live.parameters())
