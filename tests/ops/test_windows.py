import pytest
import torch

from swin_rpe_plugin.ops import pad_to_window, padded_size, window_partition


@pytest.mark.parametrize('hw,window', [((19, 23), 7), ((14, 14), 7), ((5, 9), (3, 4)),
                                       ((112, 137), (7, 12)), ((1, 1), 7)])
def test_partition_against_brute_force(hw, window):
    mh, mw = (window, window) if isinstance(window, int) else window
    x = torch.randn(2, *hw, 3)
    windows, pad = window_partition(x, window)
    hp, wp = -(-hw[0] // mh) * mh, -(-hw[1] // mw) * mw
    assert pad == (hp - hw[0], wp - hw[1]) and padded_size(hw, window) == (hp, wp)
    assert windows.shape == (2 * (hp // mh) * (wp // mw), mh * mw, 3)
    # Brute force: window w of image b holds rows wy*mh.. and columns wx*mw.., zero outside x.
    nwx = wp // mw
    for b in range(2):
        for wy in range(hp // mh):
            for wx in range(nwx):
                win = windows[(b * (hp // mh) + wy) * nwx + wx]
                for i in range(mh):
                    for j in range(mw):
                        y, xx = wy * mh + i, wx * mw + j
                        expected = x[b, y, xx] if y < hw[0] and xx < hw[1] else torch.zeros(3)
                        assert torch.equal(win[i * mw + j], expected)


def test_pad_to_window_pads_bottom_right_with_zeros():
    x = torch.ones(1, 5, 6, 2)
    y, pad = pad_to_window(x, (4, 4))
    assert pad == (3, 2) and y.shape == (1, 8, 8, 2)
    assert y[:, :5, :6].eq(1).all() and y[:, 5:].eq(0).all() and y[:, :, 6:].eq(0).all()


def test_gather_tokens_and_its_gradient_against_plain_indexing():
    from swin_rpe_plugin.ops import gather_tokens, window_plan
    plan = window_plan((9, 11), 4, (2, 2))  # 12 x 12 padded: index holds zero tokens
    x = torch.randn(2, 99, 5, dtype=torch.float64, requires_grad=True)
    out = gather_tokens(x, plan.gather, plan.scatter, True, False)
    ref = torch.cat([x, torch.zeros(2, 1, 5, dtype=x.dtype)], 1)[:, plan.gather]
    assert torch.equal(out, ref)
    back = gather_tokens(out, plan.scatter, plan.gather, False, True)
    assert torch.equal(back, x)
    torch.autograd.gradcheck(lambda t: gather_tokens(t, plan.gather, plan.scatter, True, False),
                             (x, ))
    y = out.detach().requires_grad_()
    torch.autograd.gradcheck(lambda t: gather_tokens(t, plan.scatter, plan.gather, False, True),
                             (y, ))
