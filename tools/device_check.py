"""Parity, speed, memory and kernels of our backbone against mmdet's on a GPU: run on a CUDA machine.

    .venv/bin/python tools/device_check.py [--device cuda] [--quick | --full] [--json out.json]

Without a CUDA device it prints one line saying so and exits 0. On a GPU it checks, with the
same weights, our float32 outputs and gradients against mmdet's, bf16/fp16 autocast against our
float32, then times inference and a train step of both (medians of interleaved runs), with
peak device memory, kernels launched per step (profiler) and aten operators dispatched per
step (``benchmarks/work.py``, on meta): Swin-T at 800x1216 b2 and b8 and 512x512 b2, Swin-B at
800x1216 b2 and b8, each dtype the device has, eager; compiled (both models under
torch.compile) Swin-T 800x1216 b2 (every case and dtype with ``--full``). The JSON goes to
``docs/benchmarks/gpu/<device>.json`` unless ``--json`` names another file.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.device_check import parity, speed, supported_dtypes  # noqa: E402
from benchmarks.format import format_table  # noqa: E402


def provenance() -> dict:
    """date and commit of this check, for the README's GPU line."""
    try:
        commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip() or None
    except OSError:
        commit = None
    return dict(date=time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), commit=commit)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--device', default='cuda', help='a CUDA device (default: cuda)')
    p.add_argument('--quick', action='store_true', help='Swin-T 512x512 b2 only, 3 repeats')
    p.add_argument('--full', action='store_true', help='compiled runs of every case and dtype')
    p.add_argument('--json',
                   help='write the records here (default: docs/benchmarks/gpu/<device>.json)')
    args = p.parse_args(argv)
    if not args.device.startswith('cuda'):
        p.error(f'--device {args.device!r}: this check is for CUDA devices (CPU is covered by '
                'make test and tools/benchmark.py)')
    if not torch.cuda.is_available():
        print('device_check: skipped: no CUDA device here (torch.cuda.is_available() is False); '
              'run it on a GPU machine with a CUDA build of torch')
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 parity means fp32 products
    torch.backends.cudnn.allow_tf32 = False
    name = torch.cuda.get_device_name(args.device)
    print(f'device: {name}, torch {torch.__version__}')
    dtypes = supported_dtypes(args.device)
    checks = parity(args.device, dtypes=[d for d in dtypes if d != 'fp32'])
    for record in checks:
        print('  '.join(f'{k}={v:.3g}' if isinstance(v, float) else f'{k}={v}'
                        for k, v in record.items()))
    detection, segmentation = ((800, 1216), 2), ((512, 512), 2)
    plan = [('tiny', [segmentation], False)] if args.quick else [
        ('tiny', [detection, ((800, 1216), 8), segmentation], False),
        ('base', [detection, ((800, 1216), 8)], False),
        ('tiny', [detection], True)]
    if args.full:
        plan += [('tiny', [((800, 1216), 8), segmentation], True),
                 ('base', [detection, ((800, 1216), 8)], True)]
    records = []
    for arch, cases, compiled in plan:
        new = speed(args.device, cases, ['infer', 'train'],
                    dtypes if not compiled or args.full else ['bf16'], arch=arch,
                    repeats=3 if args.quick else 5, compiled=compiled)
        print(format_table(new), flush=True)
        records += new
    path = args.json or os.path.join(ROOT, 'docs', 'benchmarks', 'gpu', ''.join(
        c if c.isalnum() else '-' for c in name.lower()) + '.json')
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, 'w') as f:
        json.dump(dict(device=name, torch=torch.__version__, **provenance(), parity=checks,
                       speed=records), f, indent=1)
    print(f'wrote {path}; `tools/benchmark.py --report docs/benchmarks/*.json` adds its README '
          'line')
    return 0


if __name__ == '__main__':
    sys.exit(main())
