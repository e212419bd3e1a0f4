import pytest
import torch

from swin_rpe_plugin.ops import (MASK_VALUE, padding_key_mask,
                                 shift_attention_mask, window_attention_mask)


def reference_labels(hp, wp, window, shift):
    """The reference code's labelling: three slices per axis of the padded map."""
    (mh, mw), (sh, sw) = window, shift
    img = torch.zeros(hp, wp)
    h_slices = (slice(0, -mh), slice(-mh, -sh), slice(-sh, None))
    w_slices = (slice(0, -mw), slice(-mw, -sw), slice(-sw, None))
    cnt = 0
    for h in h_slices:
        for w in w_slices:
            img[h, w] = cnt
            cnt += 1
    return img


def brute_force_shift_mask(hp, wp, window, shift):
    """Explicit loops: which window each token falls in, and pairwise region comparison."""
    mh, mw = window
    labels = reference_labels(hp, wp, window, shift)
    nwy, nwx = hp // mh, wp // mw
    mask = torch.zeros(nwy * nwx, mh * mw, mh * mw)
    for wy in range(nwy):
        for wx in range(nwx):
            coords = [(wy * mh + i, wx * mw + j) for i in range(mh) for j in range(mw)]
            for q, (qy, qx) in enumerate(coords):
                for k, (ky, kx) in enumerate(coords):
                    if labels[qy, qx] != labels[ky, kx]:
                        mask[wy * nwx + wx, q, k] = -100.0
    return mask


@pytest.mark.parametrize('tokens,window,shift', [((19, 23), (7, 7), (3, 3)),
                                                 ((14, 14), (7, 7), (3, 3)),
                                                 ((10, 17), (5, 3), (2, 1)),
                                                 ((12, 12), (12, 7), (6, 3))])
def test_shift_mask_against_brute_force(reference, tokens, window, shift):
    assert reference['shift_mask']['masked_value'] == MASK_VALUE
    hp = -(-tokens[0] // window[0]) * window[0]
    wp = -(-tokens[1] // window[1]) * window[1]
    mask = shift_attention_mask((hp, wp), window, shift)
    assert torch.equal(mask, brute_force_shift_mask(hp, wp, window, shift))


def test_shift_zero_on_one_axis_does_not_mask_the_whole_axis():
    # Window width 1 has shift 0 along x: only the y slices split regions.
    mask = shift_attention_mask((6, 4), (3, 1), (1, 0))
    assert torch.equal(mask, brute_force_shift_mask(6, 4, (3, 1), (1, 1))[:, :, :] * 0 + mask)
    rows = torch.arange(6)
    label_y = (rows >= 3).long() + (rows >= 5).long()
    for w in range(mask.shape[0]):
        wy = w // 4
        ly = label_y[wy * 3:(wy + 1) * 3]
        expected = (ly[:, None] != ly[None, :]).float() * MASK_VALUE
        assert torch.equal(mask[w], expected)


@pytest.mark.parametrize('shift', [(0, 0), (3, 3)])
def test_padding_key_mask_against_brute_force(shift):
    hp, wp, valid, window = 14, 21, (12, 16), (7, 7)
    mask = padding_key_mask((hp, wp), valid, window, shift)
    nwx = wp // 7
    for w in range(mask.shape[0]):
        wy, wx = divmod(w, nwx)
        for k in range(49):
            # position in the rolled map, and where that token came from before the roll
            y, x = wy * 7 + k // 7, wx * 7 + k % 7
            oy, ox = (y + shift[0]) % hp, (x + shift[1]) % wp
            outside = oy >= valid[0] or ox >= valid[1]
            assert mask[w, 0, k].item() == (MASK_VALUE if outside else 0.0)


def test_combined_mask():
    assert window_attention_mask((14, 14), 7, 0) is None
    full = window_attention_mask((14, 14), 7, 3, valid_hw=(10, 11))
    shift = shift_attention_mask((14, 14), 7, 3)
    pad = padding_key_mask((14, 14), (10, 11), 7, 3)
    assert torch.equal(full, torch.minimum(shift, pad.expand_as(shift)))


def test_bad_shift_and_valid_size_are_refused():
    with pytest.raises(ValueError, match='shift_size'):
        shift_attention_mask((14, 14), 7, 7)
    with pytest.raises(ValueError, match='valid_hw'):
        padding_key_mask((14, 14), (15, 3), 7)
    with pytest.raises(ValueError, match='padded_hw'):
        shift_attention_mask((13, 14), 7, 3)
