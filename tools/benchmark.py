"""Time and measure our Swin backbone against mmdet 3.3's, same config and weights, one run.

    .venv/bin/python tools/benchmark.py [--arch tiny] [--shape 800 1216 --shape 512 512]
        [--batch N] [--mode infer|train ...] [--dtype fp32|bf16|fp16 ...] [--threads T]
        [--repeats R] [--quick] [--compile] [--no-memory] [--profile] [--onnx]
        [--json bench.json]

Each record: medians of interleaved runs (ours_ms, mmdet_ms, speedup = mmdet/ours), peak memory
of each model in a fresh child process (peak RSS above the pre-step RSS), max_abs_diff of the
outputs on the same input, forward(+backward) GFLOPs and the fraction of this machine's sgemm
throughput that our backbone reaches. With --dtype bf16/fp16 both models run under the same
autocast; rel_err_vs_fp32 compares our outputs with our float32 ones and the roof is that
dtype's matmul peak. A low-precision dtype whose matmul peak is not 1.5x fp32's (no native
bf16 units) is skipped with a line saying so, unless --force-dtype. --profile adds, per record,
the top operators of one step of each model (share of the step's self CPU time). --onnx adds
ONNX Runtime lines: our backbone exported once with dynamic sizes against mmdet's exported at
each fixed size (inference, fp32).
"""
import json
import os
import sys

import torch
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from swin_rpe_plugin.cli import ArgumentParser  # noqa: E402
from swin_rpe_plugin.analysis.benchmark import (ARCHS, DTYPES, benchmark_case,  # noqa: E402
                                                fast_low_precision, format_profile,
                                                format_table, machine_info, sgemm_gflops)

DEFAULT_CASES = [((800, 1216), 1), ((512, 512), 2)]
V2_ARCHS = ('v2-tiny', 'v2-small', 'v2-base')  # vs transformers' Swinv2Model (see below)


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--arch', choices=sorted(ARCHS) + list(V2_ARCHS), default='tiny',
                   help='v2-*: SwinV2 against transformers\' Swinv2Model (512x512 b2, window 8; '
                   'transformers importable from PYTHONPATH)')
    p.add_argument('--shape', type=int, nargs=2, action='append', metavar=('H', 'W'),
                   help='repeatable; default 800 1216 (batch 1) and 512 512 (batch 2)')
    p.add_argument('--batch', type=int, help='batch for every shape (default 1 / 2 as above)')
    p.add_argument('--mode', choices=['infer', 'train'], action='append',
                   help='repeatable; default both')
    p.add_argument('--dtype', choices=sorted(DTYPES), action='append',
                   help='repeatable; default fp32. bf16/fp16 run both models under autocast')
    p.add_argument('--force-dtype', action='store_true',
                   help='time bf16/fp16 even where their matmul is not faster than fp32')
    p.add_argument('--threads', type=int, default=torch.get_num_threads())
    p.add_argument('--repeats', type=int, default=5)
    p.add_argument('--quick', action='store_true',
                   help='a minute on 2 cores: 224x224 batch 1, 2 repeats, no compile, no '
                   'memory runs (each memory run is a fresh process importing mmdet)')
    p.add_argument('--compile', dest='compile_lines', action='store_true', default=None,
                   help='add a torch.compile inference line for the last shape (default: on '
                   'unless --quick)')
    p.add_argument('--no-compile', dest='compile_lines', action='store_false')
    p.add_argument('--no-memory', action='store_true', help='skip the child-process memory runs')
    p.add_argument('--mask-padding', action='store_true',
                   help='also time our backbone with mask_padding=True')
    p.add_argument('--profile', action='store_true',
                   help='print (and store) the top operators of a step of each model')
    p.add_argument('--onnx', action='store_true',
                   help='add ONNX Runtime lines (ours dynamic vs mmdet fixed-size exports)')
    p.add_argument('--onnx-only', action='store_true', help='only the ONNX Runtime lines')
    p.add_argument('--json', help='write the records here')
    args = p.parse_args(argv)
    for h, w in args.shape or []:
        if h < 1 or w < 1:
            p.error(f'--shape must be positive, got {h} {w}')
    if args.repeats < 1 or args.threads < 1:
        p.error('--repeats and --threads must be >= 1')
    return args


def main_v2(args) -> int:
    """SwinV2: ours against transformers' Swinv2Model, same weights; timing and parity."""
    from swin_rpe_plugin.analysis.benchmark_v2 import (benchmark_v2_case, format_v2_line,
                                                       transformers_available)
    if not transformers_available():
        print('skip: transformers is not importable (install it in a separate folder and put '
              'that on PYTHONPATH); --arch v2-* needs its Swinv2Model as the reference')
        return 0
    cases = [(tuple(s), args.batch or 2) for s in args.shape] if args.shape else \
        [((512, 512), args.batch or 2)]
    records = []
    for shape, batch in cases:
        for mode in args.mode or ['infer', 'train']:
            records.append(benchmark_v2_case(args.arch, shape, batch, mode, args.repeats))
            print(format_v2_line(records[-1]), flush=True)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(threads=args.threads, records=records), f, indent=1)
        print(f'wrote {args.json}')
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.quick:
        args.repeats = 2
    if args.arch in V2_ARCHS:
        return main_v2(args)
    cases = [(tuple(s), args.batch or 1) for s in args.shape] if args.shape else DEFAULT_CASES
    if args.quick and not args.shape:
        cases = [((224, 224), args.batch or 1)]
    if args.quick:
        args.no_memory = True
    if args.batch and not args.shape:
        cases = [(s, args.batch) for s, _ in cases]
    modes = args.mode or ['infer', 'train']
    compile_lines = (not args.quick) if args.compile_lines is None else args.compile_lines

    machine = machine_info(args.threads)
    sgemm = {'fp32': sgemm_gflops()}
    print(f'{machine["cpu"]}, {args.threads} threads, torch {machine["torch"]}; matmul fp32: '
          f'{sgemm["fp32"]:.1f} GFLOP/s')
    dtypes = []
    for dtype in dict.fromkeys(args.dtype or ['fp32']):
        if dtype != 'fp32':
            fast, sgemm[dtype] = fast_low_precision(dtype, sgemm['fp32'])
            print(f'matmul {dtype}: {sgemm[dtype]:.1f} GFLOP/s')
            if not fast and not args.force_dtype:
                print(f'skipping {dtype} lines: this CPU runs {dtype} matmul at '
                      f'{sgemm[dtype] / sgemm["fp32"]:.2f}x its fp32 speed (no native {dtype} '
                      'units), so mixed precision would not pay here; --force-dtype times it')
                continue
        dtypes.append(dtype)

    jobs = [(s, b, m, False, {}, d) for d in dtypes for s, b in cases for m in modes]
    if args.mask_padding:
        jobs += [(s, b, 'infer', False, {'mask_padding': True}, d) for d in dtypes
                 for s, b in cases]
    if compile_lines:  # compiling Swin-T takes minutes: one line, on the last shape
        jobs += [(s, b, 'infer', True, {}, dtypes[0]) for s, b in cases[-1:] if dtypes]

    if args.onnx_only:
        jobs, args.onnx = [], True
    records = []
    with tqdm(total=len(jobs) * args.repeats, desc='benchmark', unit='run') as bar:
        for shape, batch, mode, compiled, kwargs, dtype in jobs:
            bar.set_postfix_str(f'{args.arch} {shape[0]}x{shape[1]} b{batch} {mode} {dtype}'
                                + (' compile' if compiled else ''))
            record = benchmark_case(
                args.arch, shape, batch, mode, args.repeats, args.threads, sgemm[dtype],
                measure_memory=not args.no_memory and not compiled, compile_model=compiled,
                ours_kwargs=kwargs, progress=bar, dtype=dtype,
                profile=args.profile and not compiled)
            records.append(dict(record, **machine))
    if args.onnx:
        from swin_rpe_plugin.analysis.onnx_benchmark import onnx_records
        records += [dict(r, **machine) for r in onnx_records(args.arch, cases, args.repeats,
                                                             args.threads)]
    print(format_table(records))
    for record in records:
        if 'profile' in record:
            print('\n' + format_profile(record))
    flagged = [r for r in records if r.get('flags')]
    if flagged:  # a roof or a timing taken under load: rerun on an idle machine
        print(f'{len(flagged)} record(s) flagged (roofline>1 or load average above '
              f'{args.threads} threads): numbers not trustworthy, rerun when the machine is idle')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(machine, matmul_gflops=sgemm, records=records), f, indent=1)
        print(f'wrote {args.json}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
