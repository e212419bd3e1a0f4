"""What the fixed kernel rule costs: each Swin linear's product timed in oneDNN and in MKL.

    .venv/bin/python tools/kernel_rule_cost.py [--arch tiny] [--shape 512 512] [--batch 2]
        [--dtype fp32|bf16] [--repeats 7] [--json out.json]

``ops/dispatch.py`` picks the library of every CPU linear by a fixed rule per kind, dtype and CPU
class (so that two processes compute the same bits). This prints, per product shape of the
backbone (forward and input gradient), the median time of each library and the time the whole
backbone's linears would save if each shape took the faster one: the cost of the rule against a
per-shape choice. Then the kind 'linear_gelu' (fc1 at inference): the layer's own call
(``ops.linear(..., gelu=True)``), oneDNN with GELU in its epilogue against MKL's product followed
by an in-place GELU pass, with the bias in both. Then the kind 'attention': the CPU path's window
attention forward (``swin_rpe::window_attention``, each stage's regular and shifted blocks with
their real window plans) by SDPA's flash kernel and by the explicit per-image products. ``--dtype
bf16`` times every product in bf16 (the rules for bf16; meaningful only on a CPU that multiplies
bf16 natively).

The rules' measurements by this tool, per CPU and date, are kept in docs/kernel-rules.md.
"""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from swin_rpe_plugin.analysis.models import ARCHS  # noqa: E402
from swin_rpe_plugin.cli import ArgumentParser  # noqa: E402
from swin_rpe_plugin.ops.attention import split_qkv  # noqa: E402
from swin_rpe_plugin.ops.dispatch import choose_kernel, force_kernel  # noqa: E402
from swin_rpe_plugin.ops.linear import linear  # noqa: E402
from swin_rpe_plugin.ops.plan import window_plan  # noqa: E402

DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16}


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--arch', choices=sorted(ARCHS), default='tiny')
    p.add_argument('--shape', type=int, nargs=2, default=[512, 512], metavar=('H', 'W'))
    p.add_argument('--batch', type=int, default=2)
    p.add_argument('--dtype', choices=sorted(DTYPES), default='fp32')
    p.add_argument('--repeats', type=int, default=7)
    p.add_argument('--json', help='write the per-shape records here')
    return p.parse_args(argv)


def products(arch: dict, hw, batch):
    """(name, rows, in, out, count) of every linear of the backbone, forward and grad-input."""
    h, w = -(-hw[0] // 4), -(-hw[1] // 4)
    c = arch['embed_dims']
    out = []
    for i, depth in enumerate(arch['depths']):
        rows = batch * h * w
        for name, k, n in (('qkv', c, 3 * c), ('proj', c, c), ('fc1', c, 4 * c),
                           ('fc2', 4 * c, c)):
            out += [(f'stage{i}.{name}', rows, k, n, depth),
                    (f'stage{i}.{name}.grad_input', rows, n, k, depth)]
        if i + 1 < len(arch['depths']):
            h, w = -(-h // 2), -(-w // 2)
            out += [(f'stage{i}.merge', batch * h * w, 4 * c, 2 * c, 1),
                    (f'stage{i}.merge.grad_input', batch * h * w, 2 * c, 4 * c, 1)]
            c *= 2
    return out


def attention_calls(arch: dict, hw, batch, window: int = 7):
    """(name, tokens hw, heads, shift, count) of every window attention of the backbone."""
    h, w = -(-hw[0] // 4), -(-hw[1] // 4)
    out = []
    for i, (depth, heads) in enumerate(zip(arch['depths'], arch['num_heads'])):
        out += [(f'stage{i}.regular', (h, w), heads, 0, (depth + 1) // 2),
                (f'stage{i}.shifted', (h, w), heads, window // 2, depth // 2)]
        h, w = -(-h // 2), -(-w // 2)
    return [c for c in out if c[-1]]


def attention_inputs(hw, heads: int, shift: int, batch: int, head_dim: int, dtype,
                     window: int = 7):
    """q, k, v as the block makes them (strided views of one qkv output), bias, plan."""
    plan = window_plan(hw, window, (shift, shift))
    n = window * window
    qkv = torch.randn(batch * plan.num_windows, n, 3 * heads * head_dim).to(dtype)
    q, k, v = split_qkv(qkv, heads)
    return q, k, v, torch.randn(heads, n, n), plan


def median_ms(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


@torch.no_grad()
def main(argv=None) -> int:
    args = parse_args(argv)
    onednn = torch.ops.mkldnn._linear_pointwise
    dtype = DTYPES[args.dtype]
    records, totals = [], {'onednn': 0.0, 'mkl': 0.0, 'fastest': 0.0}
    for name, rows, k, n, count in products(ARCHS[args.arch], args.shape, args.batch):
        x, weight = torch.randn(rows, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
        t = {'onednn': median_ms(lambda: onednn(x, weight, None, 'none', [], ''), args.repeats),
             'mkl': median_ms(lambda: F.linear(x, weight), args.repeats)}
        records.append(dict(name=name, rows=rows, k=k, n=n, count=count, **t))
        for lib in ('onednn', 'mkl'):
            totals[lib] += count * t[lib]
        totals['fastest'] += count * min(t.values())
        print(f'{name:24s} {rows:6d}x{k:4d}->{n:4d} x{count}: oneDNN {t["onednn"]:7.2f} ms, '
              f'MKL {t["mkl"]:7.2f} ms')
    rule = choose_kernel('linear', 'cpu', dtype)
    print(f'all linears of one forward + input-gradient pass: oneDNN {totals["onednn"]:.0f} ms, '
          f'MKL {totals["mkl"]:.0f} ms, fastest per shape {totals["fastest"]:.0f} ms: this '
          f'CPU\'s rule ({rule}): the rule costs {totals[rule] / totals["fastest"] - 1:+.1%} '
          'against a per-shape choice')
    gelu_totals, gelu_records = {'onednn': 0.0, 'mkl': 0.0}, []
    for name, rows, k, n, count in products(ARCHS[args.arch], args.shape, args.batch):
        if not name.endswith('.fc1'):
            continue
        x, weight, bias = (torch.randn(*size, dtype=dtype) for size in ((rows, k), (n, k), (n,)))
        t = {}
        for lib in gelu_totals:  # the layer's own call, as the backbone makes it
            with force_kernel('linear_gelu', lib), force_kernel('linear', 'mkl'):
                t[lib] = median_ms(lambda: linear(x, weight, bias, gelu=True), args.repeats)
        gelu_records.append(dict(name=name + '+gelu', rows=rows, k=k, n=n, count=count, **t))
        for lib in t:
            gelu_totals[lib] += count * t[lib]
        print(f'{name + "+gelu":24s} {rows:6d}x{k:4d}->{n:4d} x{count}: oneDNN fused '
              f'{t["onednn"]:7.2f} ms, MKL + GELU {t["mkl"]:7.2f} ms')
    print(f'fc1 + GELU at inference ("linear_gelu"): oneDNN fused {gelu_totals["onednn"]:.0f} ms, '
          f'MKL then GELU {gelu_totals["mkl"]:.0f} ms')
    attention_totals, attention_records = attention_cost(args, dtype)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(dtype=args.dtype, totals=totals, records=records,
                           gelu_totals=gelu_totals, gelu_records=gelu_records,
                           attention_totals=attention_totals,
                           attention_records=attention_records,
                           threads=torch.get_num_threads()), f, indent=1)
    return 0


def attention_cost(args, dtype):
    """The 'attention' kind: every window attention's forward by each kernel."""
    arch, op = ARCHS[args.arch], torch.ops.swin_rpe.window_attention
    head_dim = arch['embed_dims'] // arch['num_heads'][0]
    totals, records = {lib: 0.0 for lib in ('flash', 'explicit')}, []
    for name, hw, heads, shift, count in attention_calls(arch, args.shape, args.batch):
        q, k, v, bias, plan = attention_inputs(hw, heads, shift, args.batch, head_dim, dtype)
        t = {}
        for lib in totals:
            with force_kernel('attention', lib):
                t[lib] = median_ms(lambda: op(q, k, v, bias, plan.mask, head_dim ** -0.5,
                                              plan.num_windows), args.repeats)
            totals[lib] += count * t[lib]
        masked = 0 if plan.mask is None else plan.mask.shape[0]
        records.append(dict(name=name, windows=q.shape[0], heads=heads, masked=masked,
                            count=count, **t))
        print(f'{name:24s} {q.shape[0]:5d} windows x {heads:2d} heads ({masked} masked per '
              f'image) x{count}: flash {t["flash"]:7.2f} ms, explicit {t["explicit"]:7.2f} ms')
    print(f'window attention forward ("attention"): flash {totals["flash"]:.0f} ms, explicit '
          f'{totals["explicit"]:.0f} ms; this CPU\'s rule: '
          f'{choose_kernel("attention", "cpu", dtype)}')
    return totals, records


if __name__ == '__main__':
    sys.exit(main())
