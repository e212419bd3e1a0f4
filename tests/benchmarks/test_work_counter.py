"""The exact work counter (benchmarks/work.py) against hand counts and the seed tables.

Every number here is a count, not a timing: it is the same on any CPU, under any load.
"""
import pytest
import torch
import torch.nn.functional as F

from benchmarks.work import WorkCounter, count_work
from swin_rpe_plugin.ops import window_attention
from swin_rpe_plugin.ops.dispatch import force_kernel

F32 = 4


def test_bytes_and_flops_of_a_linear_norm_gelu_step_match_a_hand_count():
    """LayerNorm -> Linear -> GELU, forward and backward, counted by hand below."""
    rows, c_in, c_out = 200, 64, 128
    norm, fc = torch.nn.LayerNorm(c_in), torch.nn.Linear(c_in, c_out)
    x = torch.randn(2, 100, c_in)

    def step(x):
        F.gelu(fc(norm(x))).sum().backward()

    with force_kernel('linear', 'mkl'):
        work = count_work(step, x, torch.nn.ModuleList([norm, fc]), backward=True)
    act_in, act_out = rows * c_in * F32, rows * c_out * F32
    assert work['product_flops'] == 3 * 2 * rows * c_in * c_out  # forward, grad input, grad w
    kinds = work['bytes_by_kind']
    # forward: read x, weight, bias, write y, mean, rstd; backward (x needs no gradient):
    # read dy, x, mean, rstd, weight, bias, write dweight, dbias
    stats = 2 * rows * F32
    assert kinds['norm'] == (2 * act_in + 2 * c_in * F32 + stats) \
        + (2 * act_in + stats + 4 * c_in * F32)
    # gelu; gelu_backward(dy, x) -> dx, where dy is sum's gradient: one float broadcast (a
    # stride-0 view counts the memory it spans)
    assert kinds['activation'] == 2 * act_out + (F32 + 2 * act_out)
    # addmm: the bias copied into the output and read back by the product, plus the bias
    assert kinds['bias prefill'] == 2 * act_out + c_out * F32
    assert work['saved_bytes'] == act_in + stats + act_in + act_out  # x, mean/rstd, y, fc out


def test_the_flops_of_one_window_attention_layer_are_the_seed_tables_w_msa():
    """W-MSA on 112 x 112 x 128 with M = 7: 979.4355 M multiply-adds (the reference table)."""
    from swin_rpe_plugin.models.layers import ShiftWindowMSA
    attn = ShiftWindowMSA(128, 4, 7).eval()
    x = torch.randn(1, 112 * 112, 128)
    with torch.no_grad():
        work = count_work(lambda x: attn(x, (112, 112)), x, attn)
    assert work['product_flops'] / 2 == 979_435_520  # 4hwC^2 + 2M^2hwC


def test_registered_ops_are_counted_through_their_aten_kernels():
    """swin_rpe::window_attention is not a kernel: its SDPA calls are what the counter sees,
    forward and (the per-image recomputation) backward."""
    b, nw, heads, n, d = 2, 4, 2, 16, 8
    q, k, v = (torch.randn(b * nw, heads, n, d, requires_grad=True) for _ in range(3))
    bias = torch.randn(heads, n, n, requires_grad=True)
    mask = torch.zeros(2, n, n)
    mask[:, :, n // 2:] = -100.0
    counter = WorkCounter()
    with counter, force_kernel('attention', 'flash'):  # the rule's other kernel: products
        window_attention(q, k, v, bias, mask, windows_per_image=nw).sum().backward()
    ops = ' '.join(counter.by_op)
    assert '_scaled_dot_product_flash_attention_for_cpu' in ops
    assert '_softmax' in ops  # the backward's recomputed probabilities
    # forward: 2 products per window; backward: q k^T, dv, dp, dq, dk per window
    assert counter.product_flops == (2 + 5) * b * nw * heads * 2 * n * n * d


def test_a_sum_into_another_dtype_counts_the_cast_of_its_input():
    """ATen's CPU sum(dtype=float32) of a bf16 tensor casts the whole input first: the profiler
    shows aten::to inside aten::sum. The counter counts that pass; a bf16 sum has none."""
    g = torch.randn(256, 64).bfloat16()
    into_float = count_work(lambda g: g.sum(0, dtype=torch.float32), g)
    with torch.profiler.profile() as profile:
        g.sum(0, dtype=torch.float32)
    assert 'aten::to' in {e.name for e in profile.events()}  # the cast the counter adds
    native = count_work(lambda g: g.sum(0), g)
    read, cast = 256 * 64 * 2, 256 * 64 * (2 + 4)
    assert native['bytes_outside'] == read + 64 * 2
    assert into_float['bytes_outside'] == read + 64 * 4 + cast
    assert into_float['bytes_by_kind']['cast/copy'] == cast


def test_copy_and_fill_write_their_destination_without_reading_it():
    """``dst.copy_(src)``: one read of src and one write of dst (an earlier count read dst as
    well, as for ``add_``, which does read it); ``fill_``/``zero_``: one write; ``add_``: both
    operands read and self written."""
    dst, src = torch.empty(64, 32), torch.randn(32, 64)
    size = 64 * 32 * F32
    assert count_work(lambda s: dst.copy_(s.t()), src)['bytes_outside'] == 2 * size
    assert count_work(lambda s: dst.fill_(1.0), src)['bytes_outside'] == size
    assert count_work(lambda s: dst.zero_(), src)['bytes_outside'] == size
    assert count_work(lambda s: dst.add_(s.t()), src)['bytes_outside'] == 3 * size


def test_out_arguments_are_written_not_read_whatever_their_name():
    """``gelu_backward``'s out argument is ``grad_input``: written over the output gradient
    it reads, the kernel reads two tensors and writes one, like the out-of-place call."""
    x, grad = torch.randn(64, 32), torch.randn(64, 32)
    size = x.numel() * 4
    in_place = count_work(lambda g: torch.ops.aten.gelu_backward.grad_input(
        g, x, approximate='none', grad_input=g), grad)
    fresh = count_work(lambda g: torch.ops.aten.gelu_backward(g, x), grad)
    assert in_place['bytes_outside'] == fresh['bytes_outside'] == 3 * size
