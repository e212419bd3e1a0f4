import pytest
import torch

from swin_rpe_plugin.ops import (gather_relative_position_bias, relative_position_index,
                                 resize_relative_position_bias_table, table_rows)


def brute_force_index(mh, mw):
    """Explicit loops over query and key coordinates."""
    n = mh * mw
    index = torch.empty(n, n, dtype=torch.long)
    for qy in range(mh):
        for qx in range(mw):
            for ky in range(mh):
                for kx in range(mw):
                    row = (qy - ky + mh - 1) * (2 * mw - 1) + (qx - kx + mw - 1)
                    index[qy * mw + qx, ky * mw + kx] = row
    return index


def test_window_2x2_matches_worked_example(reference):
    ref = reference['relative_position_index']['window_2x2']
    index = relative_position_index(2)
    assert index.tolist() == ref['index']
    assert table_rows(2) == ref['table_rows']


def test_window_3x3_example(reference):
    ex = reference['relative_position_index']['window_3x3_example']
    index = relative_position_index(3)
    q = ex['query'][0] * 3 + ex['query'][1]
    k = ex['key'][0] * 3 + ex['key'][1]
    side = ex['table_side']
    dy, dx = ex['shifted_delta']
    assert index[q, k].item() == dy * side + dx
    assert table_rows(3) == side * side


def test_window_7x7_range(reference):
    ex = reference['relative_position_index']['window_7x7']
    index = relative_position_index(7)
    assert list(index.shape) == ex['index_shape']
    assert index.min().item() == ex['index_min'] and index.max().item() == ex['index_max']
    assert table_rows(7) == ex['table_rows']
    assert len(index.unique()) == ex['table_rows']  # every table row is used


@pytest.mark.parametrize('m', ['7', '14'])
def test_parameter_counts(reference, m):
    counts = reference['table_parameter_counts_per_head'][m]
    n = relative_position_index(int(m)).shape[0]
    assert n * n == counts['dense_B']
    assert table_rows(int(m)) == counts['compact_table']
    assert round(n * n / table_rows(int(m))) == counts['ratio_approx']


@pytest.mark.parametrize('window', [(3, 5), (7, 7), (12, 7), (1, 4), (1, 1)])
def test_index_and_bias_against_brute_force(window):
    mh, mw = window
    index = relative_position_index(window)
    assert torch.equal(index, brute_force_index(mh, mw))
    heads = 3
    table = torch.randn(table_rows(window), heads)
    bias = gather_relative_position_bias(table, index)
    n = mh * mw
    assert bias.shape == (heads, n, n)
    for qy in range(mh):
        for qx in range(mw):
            for ky in range(mh):
                for kx in range(mw):
                    row = (qy - ky + mh - 1) * (2 * mw - 1) + (qx - kx + mw - 1)
                    assert torch.equal(bias[:, qy * mw + qx, ky * mw + kx], table[row])


def test_gather_refuses_a_table_of_another_window():
    with pytest.raises(ValueError, match='rows'):
        gather_relative_position_bias(torch.zeros(9, 2), relative_position_index(3))


@pytest.mark.parametrize('bad', [0, -1, (3, 0), (2, 2, 2)])
def test_bad_window_size_is_refused(bad):
    with pytest.raises(ValueError, match='window_size'):
        relative_position_index(bad)


def test_resize_same_window_is_identity_and_grid_is_interpolated():
    table = torch.randn(table_rows((3, 5)), 2)
    assert torch.equal(resize_relative_position_bias_table(table, (3, 5), (3, 5)), table)
    resized = resize_relative_position_bias_table(table, (3, 5), (4, 6), mode='bilinear')
    assert resized.shape == (table_rows((4, 6)), 2)
    # Independent check: F.interpolate on the (2Mh-1, 2Mw-1) grid of head 1.
    grid = table[:, 1].reshape(1, 1, 5, 9)
    expected = torch.nn.functional.interpolate(grid, size=(7, 11), mode='bilinear')
    assert torch.allclose(resized[:, 1], expected.flatten())
    # Corner cells of a linear ramp stay at the ramp's ends (bilinear keeps constants).
    const = torch.full((table_rows(7), 1), 0.5)
    assert torch.allclose(resize_relative_position_bias_table(const, 7, 12), torch.tensor(0.5))
