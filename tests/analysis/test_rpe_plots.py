"""RPE pictures: the plotted data is the model's gathered bias; the PNGs have the right panels."""
import importlib.util
import pathlib

import numpy as np
import pytest
import torch
from PIL import Image

from swin_rpe_plugin import SwinTransformer
from swin_rpe_plugin.analysis import rpe_plots
from swin_rpe_plugin.ops import (gather_relative_position_bias, relative_position_index,
                                 shift_attention_mask)

TOOL = pathlib.Path(__file__).resolve().parents[2] / 'tools' / 'visualize_rpe.py'
WINDOW = (3, 5)


@pytest.fixture
def model():
    m = SwinTransformer(embed_dims=16, depths=(2, 2), num_heads=(2, 4), strides=(4, 2),
                        out_indices=(0, 1), window_size=WINDOW, drop_path_rate=0.)
    m.init_weights()
    for p in m.parameters():  # bias tables ~ N(0, 1) so every entry is distinct and visible
        if p.dim() == 2 and p.shape[0] == (2 * WINDOW[0] - 1) * (2 * WINDOW[1] - 1):
            p.data.normal_()
    return m.eval()


def _png(path, fig):
    with Image.open(path) as img:
        img.load()
        size = img.size
    width, height = fig.get_size_inches() * fig.dpi
    assert size == (round(width), round(height))
    return size


@pytest.mark.parametrize('stage, block', [(0, 0), (1, 1)])
def test_table_grid_is_the_gathered_bias(model, stage, block):
    grids = rpe_plots.bias_table_grids(model, stage, block)
    bias = model.stages[stage].blocks[block].attn.w_msa.relative_position_bias()
    mh, mw = WINDOW
    assert grids.shape == (bias.shape[0], 2 * mh - 1, 2 * mw - 1)
    coords = [(y, x) for y in range(mh) for x in range(mw)]  # row-major tokens
    for i, (qy, qx) in enumerate(coords):
        for j, (ky, kx) in enumerate(coords):
            cell = grids[:, qy - ky + mh - 1, qx - kx + mw - 1]
            torch.testing.assert_close(cell, bias[:, i, j].detach(), rtol=0, atol=0)


def test_bias_matrix_is_the_ops_gather(model):
    msa = model.stages[1].blocks[0].attn.w_msa
    expected = gather_relative_position_bias(msa.relative_position_bias_table,
                                             relative_position_index(WINDOW))
    for head in range(4):
        torch.testing.assert_close(rpe_plots.bias_matrix(model, 1, 0, head), expected[head],
                                   rtol=0, atol=0)
    with pytest.raises(ValueError, match='head 4 out of range'):
        rpe_plots.bias_matrix(model, 1, 0, 4)
    with pytest.raises(ValueError, match='stage 2 out of range'):
        rpe_plots.bias_matrix(model, 2, 0, 0)


def test_table_png_panels_and_plotted_data(model, tmp_path):
    path = tmp_path / 't.png'
    fig = rpe_plots.plot_bias_tables(model, 1, str(path), block=1)
    try:
        _png(path, fig)
        panels = [ax for ax in fig.axes if ax.get_visible() and ax.images
                  and ax.get_label() != '<colorbar>']
        colorbars = [ax for ax in fig.axes if ax.get_label() == '<colorbar>']
        assert len(panels) == 4 and len(colorbars) == 1
        assert panels[0].get_subplotspec().get_gridspec().get_geometry() == (1, 4)
        grids = rpe_plots.bias_table_grids(model, 1, 1)
        for head, ax in enumerate(panels):
            np.testing.assert_array_equal(ax.images[0].get_array(), grids[head].numpy())
            assert ax.get_title() == f'head {head}'
        # One colour scale for the stage, symmetric around zero.
        limits = {ax.images[0].get_clim() for ax in panels}
        assert limits == {(-float(grids.abs().max()), float(grids.abs().max()))}
    finally:
        rpe_plots.close(fig)


def test_matrix_and_mask_pngs(model, tmp_path):
    fig = rpe_plots.plot_bias_matrix(model, 0, 1, 1, str(tmp_path / 'm.png'))
    try:
        _png(tmp_path / 'm.png', fig)
        np.testing.assert_array_equal(fig.axes[0].images[0].get_array(),
                                      rpe_plots.bias_matrix(model, 0, 1, 1).numpy())
    finally:
        rpe_plots.close(fig)
    fig = rpe_plots.plot_shift_mask((6, 10), WINDOW, (1, 2), str(tmp_path / 's.png'))
    try:
        _png(tmp_path / 's.png', fig)
        left, right = fig.axes
        mask = shift_attention_mask((6, 10), WINDOW, (1, 2))  # [4, 15, 15], windows 2 x 2
        mosaic = right.images[0].get_array()
        n = 15
        for w in range(4):
            wy, wx = divmod(w, 2)
            np.testing.assert_array_equal(mosaic[wy * n:(wy + 1) * n, wx * n:(wx + 1) * n],
                                          mask[w].numpy())
        assert len(left.patches) == len(right.patches) == 4  # every window outlined
        assert left.images[0].get_array().shape == (6, 10)
    finally:
        rpe_plots.close(fig)


@pytest.mark.parametrize('block, query, mask_padding', [
    (0, (4, 6), False), (1, (4, 6), False), (1, (0, 0), False), (1, (9, 13), True)])
def test_query_attention_reproduces_the_block(block, query, mask_padding):
    # Stage 0 map 10 x 14 (image 40 x 56), window 3 x 5 -> padded 12 x 15; shift (1, 2).
    model = SwinTransformer(embed_dims=16, depths=(2, 2), num_heads=(2, 4), strides=(4, 2),
                            out_indices=(0, 1), window_size=WINDOW, drop_path_rate=0.,
                            mask_padding=mask_padding)
    model.init_weights()
    for name, p in model.named_parameters():
        if name.endswith('relative_position_bias_table'):
            p.data.normal_()
    model.eval()
    image = torch.randn(1, 3, 40, 56)
    data = {head: rpe_plots.query_attention(model, image, 0, block, head, query)
            for head in range(2)}
    assert data[0]['hw'] == (10, 14) and data[0]['query'] == query
    # Independent check at the block boundary: the block's attention output at the query
    # token is proj(concat_h sum_keys p_h(key) v_h(key)) with the plotted maps as p_h.
    blk = model.stages[0].blocks[block]
    seen = {}
    hooks = [blk.attn.register_forward_pre_hook(lambda m, a: seen.update(x=a[0])),
             blk.attn.register_forward_hook(lambda m, a, out: seen.update(out=out))]
    with torch.no_grad():
        model(image)
    for hook in hooks:
        hook.remove()
    msa = blk.attn.w_msa
    with torch.no_grad():  # a hooked block calls attn as mmdet's does: on norm1's output
        v = msa.qkv(seen['x'][0]).reshape(140, 3, 2, 8)[:, 2]  # [H*W, heads, hd]
    mixed = torch.cat([data[hd]['with_bias'].reshape(-1) @ v[:, hd] for hd in range(2)])
    # and attn returns the attention alone (the block adds the residual)
    expected = seen['out'][0, query[0] * 14 + query[1]]
    window_has_padding = query == (9, 13)
    if not window_has_padding or mask_padding:
        torch.testing.assert_close(msa.proj(mixed), expected, rtol=1e-4, atol=1e-5)
    for head in range(2):
        for key in ('with_bias', 'without_bias'):
            total = float(data[head][key].sum())
            assert data[head][key].shape == (10, 14) and data[head][key][query] > 0
            assert abs(total - 1) < 1e-5  # every key that gets weight is a real token
        assert not torch.allclose(data[head]['with_bias'], data[head]['without_bias'])


def test_query_attention_with_padding_keys():
    # Without mask_padding the padding tokens are keys: the map (real tokens) sums below 1.
    model = SwinTransformer(embed_dims=16, depths=(2, 2), num_heads=(2, 4), strides=(4, 2),
                            out_indices=(0, 1), window_size=WINDOW, drop_path_rate=0.).eval()
    data = rpe_plots.query_attention(model, torch.randn(1, 3, 40, 56), 0, 0, 0, (9, 13))
    assert float(data['with_bias'].sum()) < 1 - 1e-3
    torch.testing.assert_close(data['window_probs'].sum(-1), torch.ones(2))
    with pytest.raises(ValueError, match='outside the 10x14 token map'):
        rpe_plots.query_attention(model, torch.randn(1, 3, 40, 56), 0, 0, 0, (10, 0))


def test_cli_writes_pictures_from_a_checkpoint(tmp_path):
    spec = importlib.util.spec_from_file_location('visualize_rpe_tool', TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    source = SwinTransformer(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24))
    table = source.stages[2].blocks[0].attn.w_msa.relative_position_bias_table
    table.data = torch.arange(table.numel(), dtype=torch.float32).view_as(table)
    torch.save(source.state_dict(), tmp_path / 'ckpt.pth')
    written = tool.main(['--arch', 'tiny', '--checkpoint', str(tmp_path / 'ckpt.pth'),
                         '--stages', '2', '--head', '5', '--shape', '64', '64',
                         '--out', str(tmp_path / 'vis')])
    names = sorted(pathlib.Path(p).name for p in written)
    assert names == ['attention_stage2_block0_head5.png', 'rpe_matrix_stage2_block0_head5.png',
                     'rpe_tables_stage2_block0.png', 'shift_mask_14x14.png']
    with Image.open(tmp_path / 'vis' / 'rpe_tables_stage2_block0.png') as img:
        # 12 heads -> 2 rows x 8 columns of PANEL_INCHES, plus margins, at DPI
        assert img.size == (round((8 * rpe_plots.PANEL_INCHES + 1.0) * rpe_plots.DPI),
                            round((2 * rpe_plots.PANEL_INCHES + 0.5) * rpe_plots.DPI))
    loaded = SwinTransformer(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24))
    loaded.load_state_dict(torch.load(tmp_path / 'ckpt.pth'))
    torch.testing.assert_close(rpe_plots.bias_table_grids(loaded, 2, 0)[:, 6, 6],
                               table.detach()[84])  # centre offset (0, 0) = row 6 * 13 + 6
