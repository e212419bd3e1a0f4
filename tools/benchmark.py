"""Time and measure our Swin backbone against the libraries users would otherwise run, one run.

    .venv/bin/python tools/benchmark.py [--arch tiny|small|base|v2-tiny|...]
        [--shape 800 1216 --shape 512 512] [--batch N] [--mode infer|train ...]
        [--dtype fp32|bf16|fp16 ...] [--threads T] [--repeats R] [--quick] [--compile]
        [--no-memory] [--profile] [--runtime onnxruntime|openvino ...] [--runtime-only]
        [--detector mask-rcnn|upernet ...] [--padding-aware] [--window M (v2)] [--work]
        [--freeze-tables] [--with-cp] [--no-work] [--host]
        [--default-malloc]
        [--json bench.json]
    .venv/bin/python tools/benchmark.py --report bench.json [more.json ...]

Comparisons (each record: medians of interleaved runs, speedup = baseline / ours, the spread,
peak memory of each side in a fresh child process, output diffs, GFLOPs and the fraction of
this machine's matmul peak in the record's dtype, timed in the same rounds; glibc's malloc keeps
freed memory for reuse while timing, so no step pays page faults another step caused, unless
--default-malloc: before glibc 2.39 the tool starts itself again with glibc's per-thread cache
off, which reuse needs; see ``benchmarks/runner.keep_freed_memory``):
- v1 archs: mmdet 3.3's SwinTransformer against ours; v2-*: transformers' Swinv2Model against
  our SwinTransformerV2 (transformers importable from PYTHONPATH, else one skip line);
- --compile: both backbones under torch.compile (training and inference, every dtype) beside our
  eager step;
- --runtime: mmdet's fixed-size export and our dynamic export in that runtime, per precision the
  CPU runs, beside both eager models (inference);
- --detector: the stock Mask R-CNN / UperNet Swin-T configs with our backbone swapped in, same
  weights: predict and one train step (losses + backward); bf16 runs backbone and neck under
  autocast, as ``tools/train.py --amp``;
- --padding-aware: our Swin-T Mask R-CNN predicting one 800x1199 image (fp32) with the
  padding-aware option off, with mask_padding alone and on; the record's on_off is the ratio
  of the medians, ms_by_part each step's time by part (``benchmarks/padding_aware.py``).
With --dtype bf16/fp16 both sides run under the same autocast; a dtype whose matmul peak is not
1.5x fp32's (no native units) is skipped with a line saying so, unless --force-dtype.
--host measures what a GPU's host pays per step, on the generic path (``benchmarks/host.py``):
Python calls, ATen ops dispatched at the top level and thread CPU time at one thread, ours
against mmdet with Swin-T's depth at 16 channels on 64x64 images (the arithmetic vanishes).
--work counts instead of timing (``benchmarks/work.py``): product FLOPs, bytes moved outside the
products (by kind), bytes kept for backward and the allocator peak, exact and the same on every
CPU; every eager backbone record of a timed run carries the same counts under ``work``.
--profile adds the top operators of one step of each side. --report regenerates
docs/performance.md, its chart docs/images/benchmark_<cpu>.png and the README headline block
from JSON files written by --json.
"""
import json
import os
import subprocess
import sys
import time

import torch
from tqdm import tqdm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.backbone import ARCHS, DTYPES, backbone_work  # noqa: E402
from benchmarks.format import format_profile, format_table, format_work  # noqa: E402
from benchmarks.runner import (fast_low_precision, keep_freed_memory,  # noqa: E402
                               machine_info, matmul_gflops, measured_settings, restart_env,
                               run_comparison)
from swin_rpe_plugin.cli import ArgumentParser  # noqa: E402

DEFAULT_CASES = [((800, 1216), 1), ((512, 512), 2)]
V2_ARCHS = ('v2-tiny', 'v2-small', 'v2-base')  # vs transformers' Swinv2Model
DETECTORS = ('mask-rcnn', 'upernet')


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--arch', choices=sorted(ARCHS) + list(V2_ARCHS), default='tiny',
                   help='v2-*: SwinV2 against transformers\' Swinv2Model (window 8)')
    p.add_argument('--window', type=int,
                   help='SwinV2 window (default 8); transformers shrinks it to any stage map not '
                   'larger, ours never does, so parity needs maps larger than the window')
    p.add_argument('--shape', type=int, nargs=2, action='append', metavar=('H', 'W'),
                   help='repeatable; default 800 1216 (batch 1) and 512 512 (batch 2)')
    p.add_argument('--batch', type=int, help='batch for every shape (default 1 / 2 as above)')
    p.add_argument('--mode', choices=['infer', 'train'], action='append',
                   help='repeatable; default both')
    p.add_argument('--dtype', choices=sorted(DTYPES), action='append',
                   help='repeatable; default fp32. bf16/fp16 run both sides under autocast')
    p.add_argument('--force-dtype', action='store_true',
                   help='time bf16/fp16 even where their matmul is not faster than fp32')
    p.add_argument('--threads', type=int, default=torch.get_num_threads())
    p.add_argument('--repeats', type=int, default=5)
    p.add_argument('--quick', action='store_true',
                   help='a minute on 2 cores: 224x224 batch 1, 2 repeats, no compile, no '
                   'memory runs (each memory run is a fresh process importing mmdet)')
    p.add_argument('--compile', dest='compile_lines', action='store_true', default=None,
                   help='add torch.compile lines (train and infer, every dtype) for the last '
                   'shape (default: on unless --quick)')
    p.add_argument('--no-compile', dest='compile_lines', action='store_false')
    p.add_argument('--no-memory', action='store_true', help='skip the child-process memory runs')
    p.add_argument('--no-work', action='store_true',
                   help='skip the exact work counts each eager backbone record carries (three '
                   'sides, a few steps each at one thread: minutes at Swin-L\'s detection sizes)')
    p.add_argument('--mask-padding', action='store_true',
                   help='also time our backbone with mask_padding=True')
    p.add_argument('--profile', action='store_true',
                   help='print (and store) the top operators of a step of each side')
    p.add_argument('--runtime', action='append', choices=['onnxruntime', 'openvino'],
                   help='repeatable: add exported-model lines in that runtime')
    p.add_argument('--runtime-only', action='store_true', help='only the runtime lines')
    p.add_argument('--detector', action='append', choices=DETECTORS,
                   help='repeatable: time the whole stock model with our backbone swapped in')
    p.add_argument('--padding-aware', action='store_true',
                   help='time Mask R-CNN (Swin-T, random weights) at batch 1 with the '
                   'padding-aware option on against off (docs/padding-aware.md); --shape and '
                   '--batch change the image and the batch')
    p.add_argument('--detector-only', action='store_true',
                   help='only the whole-model lines (--detector, --padding-aware)')
    p.add_argument('--work', action='store_true',
                   help='only the exact work counts, no timing (benchmarks/work.py): product '
                   'FLOPs, bytes moved outside the products by kind, bytes kept for backward '
                   'and the allocator peak of mmdet, ours and ours on the generic path; '
                   'default 224x224 b1, infer and train, fp32 and bf16, a few seconds')
    p.add_argument('--freeze-tables', action='store_true',
                   help='with --work: the relative position tables take no gradient in either '
                   'model (the CPU\'s SDPA then runs its fused kernels both ways, as a GPU\'s '
                   'does with or without a bias gradient)')
    p.add_argument('--with-cp', action='store_true',
                   help='both backbones checkpoint their blocks (mmdet\'s with_cp=True): train '
                   'steps only (the default mode then); with --work too')
    p.add_argument('--host', action='store_true',
                   help='only the host work per step on the generic path (benchmarks/host.py), '
                   'ours against mmdet: Python calls, top-level ATen ops and thread CPU time '
                   'at one thread, Swin-T\'s depth at 16 channels on 64x64, tables frozen; '
                   'default train and infer, fp32 and bf16, b2 and b8, drop path 0.2 and 0; '
                   'with --detector mask-rcnn the whole model\'s train step too')
    p.add_argument('--default-malloc', action='store_true',
                   help='time with the C library\'s default malloc, which hands blocks of 32 MiB '
                   'and more back when freed (each step then pays page faults that depend on '
                   'what ran before it)')
    p.add_argument('--json', help='write the records here')
    p.add_argument('--report', nargs='+', metavar='JSON',
                   help='regenerate docs/performance.md, its chart and the README headline from '
                   'these JSON files (no timing run)')
    args = p.parse_args(argv)
    for h, w in args.shape or []:
        if h < 1 or w < 1:
            p.error(f'--shape must be positive, got {h} {w}')
    if args.repeats < 1 or args.threads < 1:
        p.error('--repeats and --threads must be >= 1')
    if args.window is not None and (args.window < 1 or args.arch not in V2_ARCHS):
        p.error('--window is for --arch v2-* and must be >= 1')
    whole = args.runtime or args.detector or args.padding_aware
    if args.freeze_tables and not args.work:
        p.error('--freeze-tables goes with --work')
    if args.with_cp and (args.arch in V2_ARCHS or whole or args.host or args.mask_padding
                         or 'infer' in (args.mode or [])):
        p.error('--with-cp checkpoints v1 backbones in train steps: drop --mode infer, '
                '--runtime/--detector/--padding-aware/--host/--mask-padding, use a v1 --arch')
    if args.host and (args.work or args.runtime or args.padding_aware or args.compile_lines
                      or args.arch != 'tiny'):
        p.error('--host measures Swin-T\'s depth alone (and --detector mask-rcnn): drop '
                '--work/--runtime/--padding-aware/--compile/--arch')
    if args.work and whole:
        p.error('--work counts backbones: drop --runtime/--detector/--padding-aware')
    if args.work and args.arch in V2_ARCHS and (args.with_cp or args.freeze_tables):
        p.error('--with-cp and --freeze-tables count v1 backbones (SwinV2 has no tables, '
                'transformers no with_cp): drop them or use a v1 --arch')
    if args.arch in V2_ARCHS and whole:
        p.error('--runtime, --detector and --padding-aware compare v1 backbones: drop them or '
                'use --arch tiny')
    return args


def cases_of(args):
    if args.shape:
        return [(tuple(s), args.batch or 1) for s in args.shape]
    if args.quick or args.work:
        return [((224, 224), args.batch or 1)]
    if args.arch in V2_ARCHS:
        return [((512, 512), args.batch or 2)]
    return [(s, args.batch or b) for s, b in DEFAULT_CASES]


def modes_of(args):
    """The modes asked, else both (train alone with --with-cp: inference keeps nothing)."""
    return args.mode or (['train'] if args.with_cp else ['infer', 'train'])


def runnable_dtypes(args, peaks):
    dtypes = []
    for dtype in dict.fromkeys(args.dtype or ['fp32']):
        if dtype != 'fp32':
            fast, peaks[dtype] = fast_low_precision(dtype, peaks['fp32'])
            print(f'matmul {dtype}: {peaks[dtype]:.1f} GFLOP/s')
            if not fast and not args.force_dtype:
                print(f'skipping {dtype} lines: this CPU runs {dtype} matmul at '
                      f'{peaks[dtype] / peaks["fp32"]:.2f}x its fp32 speed (no native {dtype} '
                      'units), so mixed precision would not pay here; --force-dtype times it')
                continue
        dtypes.append(dtype)
    return dtypes


def jobs_of(args, dtypes):
    """(label, builder of a Comparison, memory?) per record, built one at a time."""
    from benchmarks.backbone import backbone_comparison
    cases, modes = cases_of(args), modes_of(args)
    cp = args.with_cp
    compile_lines = (not args.quick) if args.compile_lines is None else args.compile_lines
    jobs = []
    only = args.runtime_only or args.detector_only
    if args.arch in V2_ARCHS:
        from benchmarks.v2 import v2_comparison
        jobs += [(f'{s[0]}x{s[1]} b{b} {m} {d}',
                  lambda s=s, b=b, m=m, d=d: v2_comparison(args.arch, s, b, m, d,
                                                           args.window or 8), True)
                 for d in dtypes for s, b in cases for m in modes]
        return jobs
    if not only:
        jobs += [(f'{s[0]}x{s[1]} b{b} {m} {d}',
                  lambda s=s, b=b, m=m, d=d: backbone_comparison(args.arch, s, b, m, d,
                                                                 with_cp=cp), True)
                 for d in dtypes for s, b in cases for m in modes]
        if args.mask_padding:
            jobs += [(f'{s[0]}x{s[1]} b{b} infer {d} mask_padding',
                      lambda s=s, b=b, d=d: backbone_comparison(
                          args.arch, s, b, 'infer', d, ours_kwargs={'mask_padding': True}), True)
                     for d in dtypes for s, b in cases]
        if compile_lines:  # compiling Swin-T takes minutes: the last shape only, every dtype
            jobs += [(f'{s[0]}x{s[1]} b{b} {m} {d} compile',
                      lambda s=s, b=b, m=m, d=d: backbone_comparison(
                          args.arch, s, b, m, d, compile_model=True, with_cp=cp), False)
                     for d in dtypes for s, b in cases[-1:] for m in modes]
    if args.detector and not args.runtime_only:
        from benchmarks.detector import DEFAULT_CASES, detector_comparison
        for det in args.detector:  # each model at its own size unless --shape says
            det_cases = [(tuple(s), args.batch or DEFAULT_CASES[det][1]) for s in args.shape] \
                if args.shape else [DEFAULT_CASES[det]]
            jobs += [(f'{det} {s[0]}x{s[1]} b{b} {m} {d}',
                      lambda det=det, s=s, b=b, m=m, d=d: detector_comparison(det, s, m, d, b),
                      True)
                     for d in dtypes for s, b in det_cases for m in modes]
    if args.padding_aware and not args.runtime_only:
        from benchmarks.padding_aware import DEFAULT_CASE, padding_aware_comparison
        pa_cases = [(tuple(s), args.batch or 1) for s in args.shape] if args.shape \
            else [DEFAULT_CASE]
        jobs += [(f'padding-aware {s[0]}x{s[1]} b{b} infer fp32',
                  lambda s=s, b=b: padding_aware_comparison(s, b), False)
                 for s, b in pa_cases]
    return jobs


def runtime_records(args, progress):
    """Records of every runtime and precision this CPU runs, one export of ours per run."""
    from benchmarks.exports import RuntimeExports
    from swin_rpe_plugin.deploy.runtimes import get_runtime
    records = []
    with RuntimeExports(args.arch, args.threads) as exports:
        for name in args.runtime:
            runtime = get_runtime(name)
            reason = runtime.available()
            if reason is not None:
                print(f'skip {name}: {reason}')
                continue
            for precision in runtime.precisions():
                for shape, batch in cases_of(args):
                    progress.set_postfix_str(f'{name} {precision} {shape[0]}x{shape[1]} b{batch}')
                    c = exports.comparison(runtime, precision, shape, batch)
                    records.append(run_comparison(c, args.repeats, args.threads, progress))
    return records


def provenance(argv) -> dict:
    """Command, date and commit of this run, for the report."""
    try:
        commit = subprocess.run(['git', '-C', ROOT, 'rev-parse', '--short', 'HEAD'],
                                capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = 'unknown'
    command = ' '.join(['tools/benchmark.py'] + list(sys.argv[1:] if argv is None else argv))
    # Kernel, backend, instruction-set and malloc overrides change what is measured: they belong
    # to the command; nothing else of the environment does (benchmarks/runner.MEASURED_SETTINGS).
    settings = ' '.join(measured_settings())
    return dict(command=f'{settings} {command}' if settings else command,
                date=time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), commit=commit)


def work_main(args, argv, machine) -> int:
    """--work: the exact counts of every case, mode and dtype (fp32 and bf16 by default)."""
    records = [dict(backbone_work(args.arch, shape, batch, mode, dtype,
                                  freeze_tables=args.freeze_tables, with_cp=args.with_cp),
                    **machine)
               for dtype in dict.fromkeys(args.dtype or ['fp32', 'bf16'])
               for shape, batch in cases_of(args) for mode in modes_of(args)]
    print(format_work(records))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(machine, **provenance(argv), records=records), f, indent=1)
        print(f'wrote {args.json}')
    return 0


def host_main(args, argv, machine) -> int:
    """--host: the host work records (every mode, dtype, batch and drop path asked)."""
    from benchmarks.format import format_host
    from benchmarks.host import detector_host_record, host_record
    cases = [(mode, dtype, batch, rate) for mode in args.mode or ['train', 'infer']
             for dtype in dict.fromkeys(args.dtype or ['fp32', 'bf16'])
             for batch in ([args.batch] if args.batch else [2, 8]) for rate in (0.2, 0.0)]
    records = []
    for mode, dtype, batch, rate in tqdm(cases, desc='host', unit='case'):
        records.append(dict(host_record(mode, dtype, batch, rate, args.repeats), **machine))
    for name in args.detector or []:
        if name != 'mask-rcnn':
            print(f'skip {name}: --host counts the Mask R-CNN train step only')
            continue
        records.append(dict(detector_host_record(name), **machine))
    print(format_host(records))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(machine, **provenance(argv), records=records), f, indent=1)
        print(f'wrote {args.json}')
    return 0


def main(argv=None, restart: bool = False) -> int:
    """``restart``: when run as a script, start again with glibc's per-thread cache off where
    keeping freed memory needs it (``benchmarks/runner.keep_freed_memory``)."""
    args = parse_args(argv)
    if args.report:
        from benchmarks.report import write_report
        for path in write_report(args.report, ROOT):
            print(f'wrote {os.path.relpath(path, ROOT)}')
        return 0
    torch.set_num_threads(args.threads)
    if args.quick:
        args.repeats, args.no_memory = 2, True
    if args.arch in V2_ARCHS:
        from benchmarks.v2 import transformers_available
        if not transformers_available():
            print('skip: transformers is not importable (install it in a separate folder and '
                  'put that on PYTHONPATH); --arch v2-* needs its Swinv2Model as the reference')
            return 0

    machine = machine_info(args.threads)
    if args.work:
        return work_main(args, argv, machine)
    if args.host:
        return host_main(args, argv, machine)
    env = restart_env() if restart and not args.default_malloc else None
    if env is not None:
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    malloc = 'default' if args.default_malloc else keep_freed_memory()
    peaks = {'fp32': matmul_gflops()}
    print(f'{machine["cpu"]}, {args.threads} threads, torch {machine["torch"]}; matmul fp32: '
          f'{peaks["fp32"]:.1f} GFLOP/s; malloc: {malloc}')
    dtypes = runnable_dtypes(args, peaks)
    jobs = [] if args.runtime_only else jobs_of(args, dtypes)
    records = []
    with tqdm(total=len(jobs) * args.repeats, desc='benchmark', unit='run') as bar:
        for label, build, memory in jobs:
            bar.set_postfix_str(f'{args.arch} {label}')
            record = run_comparison(build(), args.repeats, args.threads, bar,
                                    profile=args.profile,
                                    measure_memory=memory and not args.no_memory)
            if record['kind'] == 'backbone' and '+' not in record['mode'] \
                    and 'mask_padding' not in record and not args.no_work:
                record['work'] = backbone_work(record['arch'], record['shape'], record['batch'],
                                               record['mode'], record['dtype'],
                                               with_cp=args.with_cp)['sides']
            records.append(dict(record, **machine))
        if args.runtime:
            records += [dict(r, **machine) for r in runtime_records(args, bar)]
    print(format_table(records))
    for record in records:
        if record['kind'] == 'padding-aware':
            from benchmarks.padding_aware import format_padding_aware
            print('\n' + format_padding_aware(record))
    for record in records:
        if 'profile' in record:
            print('\n' + format_profile(record))
    flagged = [r for r in records if r.get('flags')]
    if flagged:  # a roof or a timing taken under load: rerun on an idle machine
        print(f'{len(flagged)} record(s) flagged (roofline>1 or load average above '
              f'{args.threads} threads): numbers not trustworthy, rerun when the machine is idle')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(machine, matmul_gflops=peaks, malloc=malloc, **provenance(argv),
                           records=records),
                      f, indent=1)
        print(f'wrote {args.json}')
    return 0


if __name__ == '__main__':
    sys.exit(main(restart=True))
