"""Parity and speed of our backbone against mmdet's on a GPU: run on a CUDA machine.

    .venv/bin/python tools/device_check.py [--device cuda] [--quick] [--json out.json]

Without a CUDA device it prints one line saying so and exits 0. On a GPU it checks, with the
same weights, our float32 outputs and gradients against mmdet's, bf16/fp16 autocast against our
float32, then times inference and a train step of both (medians of interleaved runs, peak
device memory) at 512x512 b2 and 800x1216 b1 in each supported dtype.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.device_check import parity, speed, supported_dtypes  # noqa: E402
from benchmarks.format import format_table  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--device', default='cuda', help='a CUDA device (default: cuda)')
    p.add_argument('--quick', action='store_true', help='512x512 b2 only, 3 repeats')
    p.add_argument('--json', help='write parity and speed records here')
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
    print(f'device: {torch.cuda.get_device_name(args.device)}, torch {torch.__version__}')
    dtypes = supported_dtypes(args.device)
    checks = parity(args.device, dtypes=[d for d in dtypes if d != 'fp32'])
    for record in checks:
        print('  '.join(f'{k}={v:.3g}' if isinstance(v, float) else f'{k}={v}'
                        for k, v in record.items()))
    cases = [((512, 512), 2)] + ([] if args.quick else [((800, 1216), 1)])
    records = speed(args.device, cases, ['infer', 'train'], dtypes,
                    repeats=3 if args.quick else 10)
    print(format_table(records))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(device=torch.cuda.get_device_name(args.device), parity=checks,
                           speed=records), f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main())
