"""Export a backbone, backbone + neck, or whole model of a config to ONNX with dynamic batch,
height and width, then check the file with ONNX Runtime against PyTorch at several sizes.

    .venv/bin/python tools/export_onnx.py CONFIG [--checkpoint CKPT] --out FILE
        [--part backbone|neck|model] [--shape H W] [--batch N] [--opset N]
        [--exporter dynamo|classic] [--fixed-size] [--tolerance T] [--cfg-options k=v ...]

Without --checkpoint the weights stay as built (no init_cfg file is read). The check runs the
file at the export size, at an odd size that needs window padding, and with another batch at a
third size, and prints the max abs diff of each output; exit 1 if one exceeds --tolerance.
What --part model covers per model type: see swin_rpe_plugin/deploy/onnx.py and the README;
a head that cannot take a dynamic size (UperNet's pyramid pooling) needs --fixed-size (dynamic
batch only; the check then varies the batch alone).
"""
import argparse
import os
import sys
import time

import torch
from mmengine.config import DictAction

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from swin_rpe_plugin.deploy import (EXPORTERS, PARTS, build_export_part,  # noqa: E402
                                    export_onnx, verify_onnx)
from swin_rpe_plugin.engine import UsageError  # noqa: E402


def check_sizes(batch: int, h: int, w: int, dynamic_hw: bool = True):
    """The export size, an odd size, and another batch at a third size (with a fixed size:
    the export size at three batches)."""
    if not dynamic_hw:
        return [(batch, h, w), (batch + 1, h, w), (batch + 2, h, w)]
    odd = (h * 3 // 4) | 1, (w * 5 // 4) | 1
    return [(batch, h, w), (batch, *odd), (batch + 1, h // 2 + 3, w // 2 + 9)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('config')
    p.add_argument('--checkpoint', help='weights to load (any format load_pretrained reads)')
    p.add_argument('--out', required=True, help='the .onnx file to write')
    p.add_argument('--part', choices=PARTS, default='backbone')
    p.add_argument('--shape', type=int, nargs=2, default=(224, 224), metavar=('H', 'W'))
    p.add_argument('--batch', type=int, default=1)
    p.add_argument('--opset', type=int, default=18)
    p.add_argument('--exporter', choices=EXPORTERS, default='dynamo')
    p.add_argument('--fixed-size', action='store_true',
                   help='dynamic batch only: for heads with adaptive pooling (UperNet)')
    p.add_argument('--tolerance', type=float, default=1e-4)
    p.add_argument('--cfg-options', nargs='+', action=DictAction)
    args = p.parse_args(argv)
    if min(args.shape) < 1 or args.batch < 1:
        p.error('--shape and --batch must be positive')
    try:
        if args.checkpoint and not os.path.isfile(args.checkpoint):
            raise UsageError(f'--checkpoint: file not found: {args.checkpoint!r}')
        module = build_export_part(args.config, args.part, args.checkpoint, args.cfg_options)
        if args.fixed_size and args.exporter == 'classic':
            raise UsageError('--fixed-size needs --exporter dynamo: the classic exporter traces '
                             'sizes as tensors, so the heads never see a fixed size')
        reason = module.fixed_size_reason()
        if reason and not args.fixed_size:
            raise UsageError(f'--part {args.part} of {args.config}: {reason}; export it with '
                             '--fixed-size (dynamic batch only) or export --part backbone')
    except (UsageError, ValueError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    torch.manual_seed(0)
    example = torch.randn(args.batch, 3, *args.shape)
    start = time.time()
    export_onnx(module, example, args.out, args.exporter, args.opset,
                module.output_names(example), dynamic_hw=not args.fixed_size)
    dynamic = 'dynamic batch' + ('' if args.fixed_size else ', height and width')
    print(f'exported {args.part} of {args.config} with the {args.exporter} exporter to '
          f'{args.out} ({time.time() - start:.0f} s, {dynamic})')
    sizes = check_sizes(args.batch, *args.shape, dynamic_hw=not args.fixed_size)
    inputs = [torch.randn(b, 3, h, w) for b, h, w in sizes]
    worst = 0.0
    for record in verify_onnx(args.out, module, inputs):
        diffs = record['max_abs_diff']
        worst = max(worst, *diffs)
        print('onnxruntime vs pytorch at ' + 'x'.join(map(str, record['shape'])) + ': '
              + ', '.join(f'{d:.1e}' for d in diffs))
    verdict = 'ok' if worst <= args.tolerance else 'MISMATCH'
    print(f'{verdict}: max abs diff {worst:.1e} (tolerance {args.tolerance:g})')
    return 0 if worst <= args.tolerance else 1


if __name__ == '__main__':
    sys.exit(main())
