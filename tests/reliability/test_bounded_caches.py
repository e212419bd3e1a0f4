"""Bounded caches: 200 forwards at ever-changing sizes keep the plan cache at its bound and the
resident memory flat, where an unbounded cache would keep every plan it ever built."""
import ctypes
import random

import pytest
import torch

from swin_rpe_plugin import SwinTransformer
from swin_rpe_plugin.models.layers import WindowMSA
from swin_rpe_plugin.ops import cached_window_plan, window_plan
from swin_rpe_plugin.ops.dispatch import force_kernel

MiB = 2**20
# Forwards before the measurement. Besides our plan cache (full after 8 forwards), oneDNN's
# per-shape cache behind torch.ops.mkldnn (LRU_CACHE_CAPACITY, 1024 entries by default) fills
# in ~50 forwards of ~20 new linear shapes each and holds ~200 MiB at these sizes: bounded, so
# it is filled first; what is measured after it is growth that a bound would not stop.
WARM_UP = 100


def lru(fn):
    """The functools.lru_cache under any decorators that wrap it (functools.wraps chains)."""
    while not hasattr(fn, 'cache_info'):
        fn = fn.__wrapped__
    return fn


PLAN_CACHE = lru(cached_window_plan)


def rss_bytes() -> int:
    """Resident set size, after handing freed heap pages back to the kernel (glibc), so that
    what is counted is what is still allocated, not the allocator's high-water mark."""
    try:
        ctypes.CDLL('libc.so.6').malloc_trim(0)
    except (OSError, AttributeError):
        pass
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmRSS:'):
                return int(line.split()[1]) * 1024
    raise RuntimeError('no VmRSS in /proc/self/status')


def plan_bytes(plan) -> int:
    tensors = [plan.gather, plan.scatter] + ([] if plan.mask is None else [plan.mask])
    return sum(t.numel() * t.element_size() for t in tensors)


def stage_sizes(h: int, w: int, stages: int):
    hh, ww = -(-h // 4), -(-w // 4)
    for _ in range(stages):
        yield hh, ww
        hh, ww = -(-hh // 2), -(-ww // 2)


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see test_fuzz.py: two OpenMP threads crawl on a busy machine
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def onednn_linears():
    """Every linear on oneDNN, whatever this CPU's rule: its per-shape cache (above) then fills
    within the warm-up on every machine (with only fc1 + GELU there, 4 shapes a forward, it
    would still be filling while memory is measured)."""
    with force_kernel('linear', 'onednn'), force_kernel('linear_gelu', 'onednn'):
        yield


def test_200_forwards_at_changing_sizes_keep_caches_and_memory_bounded(one_thread,
                                                                         onednn_linears):
    torch.manual_seed(0)
    model = SwinTransformer(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 1, 2, 2),
                            window_size=7, mlp_ratio=2, drop_path_rate=0.0,
                            mask_padding=True).eval()
    model.init_weights()
    rng = random.Random(0)
    sizes = set()
    while len(sizes) < WARM_UP + 200:  # every forward at a size never seen before
        sizes.add((rng.randint(300, 600), rng.randint(300, 600)))
    sizes = sorted(sizes, key=lambda s: rng.random())
    sizes.insert(0, (600, 600))  # the largest first: the allocator's pools reach their peak
    PLAN_CACHE.cache_clear()

    def forward(hw):
        with torch.no_grad():
            model(torch.randn(1, 3, *hw))

    for hw in sizes[:WARM_UP + 1]:  # warm-up: fills the bounded caches and allocator pools
        forward(hw)
    assert PLAN_CACHE.cache_info().currsize == 64
    rss_before = rss_bytes()
    unbounded = 0  # what an unbounded cache would have kept from the measured forwards
    for hw in sizes[WARM_UP + 1:]:
        forward(hw)
        for tokens in stage_sizes(*hw, 4):
            for shift in ((0, 0), (3, 3)):
                unbounded += plan_bytes(window_plan(tokens, 7, shift, tokens))
    rss_after = rss_bytes()
    info = PLAN_CACHE.cache_info()
    growth = rss_after - rss_before
    print(f'\nplan cache {info}; RSS before {rss_before / MiB:.1f} MiB, after '
          f'{rss_after / MiB:.1f} MiB, growth {growth / MiB:.1f} MiB; an unbounded cache would '
          f'hold {unbounded / MiB:.1f} MiB more')
    assert info.currsize == info.maxsize == 64
    # 4 stages x 2 shifts per forward; small late-stage sizes recur and hit the cache.
    assert info.hits + info.misses == 8 * len(sizes) and info.misses > 6 * len(sizes)
    # Every WindowMSA keeps one gathered bias: [heads, 49, 49] for its own table.
    for module in model.modules():
        if isinstance(module, WindowMSA):
            key, bias = module._kept_bias._entry
            assert bias.shape == (module.num_heads, 49, 49)
    assert unbounded > 256 * MiB  # so the bound below is one a leak would break
    assert growth < 64 * MiB
