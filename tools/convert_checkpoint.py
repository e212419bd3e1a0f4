"""Convert a Swin checkpoint of any supported format to this package's (mmdet-style) keys.

    .venv/bin/python tools/convert_checkpoint.py SRC DST [--window 12] [--img-size 384]
        [--mode bicubic|bilinear] [--format NAME] [--src-window H W] [--allow-pickle]
        [--backbone-only] [-v]

Formats (detected from the keys): mmdet (mmdet/mmseg/mmpretrain, whole models included),
official (Microsoft, timm < 0.9), timm, torchvision, transformers. DST ending in
``.safetensors`` is written with safetensors, otherwise as ``{'state_dict': ...}`` with
torch.save. A whole detector or segmentor stays whole: its backbone is converted (and resized),
every other key passed through; ``--backbone-only`` keeps the backbone alone. Prints the
report; exits 2 when SRC is unrecognised, unsafe, unreadable or invalid.
"""
import argparse
import sys

from swin_rpe_plugin.cli import ArgumentParser
from swin_rpe_plugin.checkpoint import FORMATS_BY_NAME, UnsafeCheckpointError, convert_file


def parse_args(argv=None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('src', help='source checkpoint (.pth/.pt/.bin/.ckpt or .safetensors)')
    parser.add_argument('dst', help='output file (.pth or .safetensors)')
    parser.add_argument('--window', type=int, nargs='+', metavar='M',
                        help='resize bias tables to this window (M or H W)')
    parser.add_argument('--img-size', type=int, nargs='+', metavar='S',
                        help='resize an absolute position embedding to this image size (S or H W)')
    parser.add_argument('--mode', choices=('bicubic', 'bilinear'), default='bicubic')
    parser.add_argument('--format', choices=sorted(FORMATS_BY_NAME), help='skip detection')
    parser.add_argument('--src-window', type=int, nargs=2, metavar=('H', 'W'),
                        help='window of the source tables when it is not square')
    parser.add_argument('--allow-pickle', action='store_true',
                        help='unpickle arbitrary objects (runs code from SRC: trusted files only)')
    parser.add_argument('--backbone-only', action='store_true',
                        help='from a whole detector/segmentor keep only the backbone (default: '
                        'backbone converted, every other key passed through)')
    parser.add_argument('-v', '--verbose', action='store_true', help='list every key')
    return parser.parse_args(argv)


def _pair(values):
    return None if values is None else values[0] if len(values) == 1 else tuple(values)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        report = convert_file(args.src, args.dst, window=_pair(args.window),
                              img_size=_pair(args.img_size), mode=args.mode,
                              allow_pickle=args.allow_pickle, format=args.format,
                              src_window=args.src_window, log=False,
                              backbone_only=args.backbone_only)
    except (KeyError, ValueError, TypeError, FileNotFoundError, UnsafeCheckpointError) as err:
        print(f'error: {type(err).__name__}: {err}', file=sys.stderr)
        return 2
    print(f'{args.src} -> {args.dst}\n{report.summary()}')
    if args.verbose:
        print(report.details())
    return 0


if __name__ == '__main__':
    sys.exit(main())
