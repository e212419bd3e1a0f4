import pytest
import torch
import torch.nn.functional as F

from swin_rpe_plugin.ops import (cached_window_plan, window_attention_mask, window_partition,
                                 window_plan)


def reference_windows(x, window, shift):
    """Reference data movement: pad, roll, partition ([B, H, W, C] -> [B * nW, N, C])."""
    mh, mw = window
    h, w = x.shape[1:3]
    x = F.pad(x, (0, 0, 0, (-w) % mw, 0, (-h) % mh))
    x = torch.roll(x, shifts=(-shift[0], -shift[1]), dims=(1, 2))
    return window_partition(x, window)[0]


@pytest.mark.parametrize('hw,window,shift,valid', [
    ((19, 23), (7, 7), (3, 3), None), ((14, 14), (7, 7), (0, 0), None),
    ((10, 17), (5, 3), (2, 1), None), ((19, 23), (7, 7), (3, 3), (19, 23)),
    ((12, 12), (7, 12), (3, 6), (12, 12)), ((1, 1), (7, 7), (3, 3), None)])
def test_plan_reproduces_pad_roll_partition_and_masks(hw, window, shift, valid):
    x = torch.randn(2, *hw, 3)
    plan = window_plan(hw, window, shift, valid)
    ref = reference_windows(x, window, shift)  # [B * nW, N, C], windows row-major
    ref_mask = window_attention_mask(
        tuple(-(-s // m) * m for s, m in zip(hw, window)), window, shift, valid)
    nw = plan.num_windows
    src = torch.cat([x.reshape(2, -1, 3), torch.zeros(2, 1, 3)], 1)
    got = src[:, plan.gather].reshape(2 * nw, -1, 3)
    # Plan order is a permutation of the windows: unmasked first, masked last.
    nm = 0 if plan.mask is None else plan.mask.shape[0]
    masked = (torch.zeros(nw, dtype=torch.bool) if ref_mask is None
              else (ref_mask != 0).flatten(1).any(1))
    order = torch.cat([torch.nonzero(~masked)[:, 0], torch.nonzero(masked)[:, 0]])
    assert int(masked.sum()) == nm
    assert torch.equal(got, ref.view(2, nw, -1, 3)[:, order].reshape(2 * nw, -1, 3))
    if nm:
        assert torch.equal(plan.mask, ref_mask[order[nw - nm:]])
    # The scatter index undoes the gather exactly.
    assert torch.equal(got.reshape(2, -1, 3)[:, plan.scatter], x.reshape(2, -1, 3))
    assert plan.needs_pad_row == bool((plan.gather == hw[0] * hw[1]).any())


def test_plan_cache_is_bounded_and_shared():
    args = ((19, 23), (7, 7), (3, 3), None, torch.device('cpu'), torch.float32)
    assert cached_window_plan(*args) is cached_window_plan(*args)
    assert cached_window_plan.cache_info().maxsize == 64
