"""Draw the relative position bias of a Swin backbone, its shift mask and window attention.

    .venv/bin/python tools/visualize_rpe.py --arch tiny --checkpoint swin_tiny.pth --out vis/
    .venv/bin/python tools/visualize_rpe.py --arch tiny --stages 0 --head 1 --image cat.jpg

Writes PNGs to --out: per stage the bias table of every head (rpe_tables_stage{i}_block{b}),
the full bias matrix of one head (rpe_matrix_...), the shifted-window mask (shift_mask_...) and
one query's attention on an image with and without the bias (attention_...). Without
--checkpoint the model is freshly initialised (bias tables ~ N(0, 0.02^2): noise, not learned).
"""
import argparse
import os
import sys

import numpy as np
import torch
from tqdm import tqdm

from swin_rpe_plugin.analysis import ARCHS, ARCHS_V2
from swin_rpe_plugin.cli import ArgumentParser
from swin_rpe_plugin.analysis import cpb_plots, rpe_plots
from swin_rpe_plugin.checkpoint import UnsafeCheckpointError, load_pretrained
from swin_rpe_plugin.models import SwinTransformer, SwinTransformerV2

IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)


def parse_args(argv=None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--arch', choices=sorted(ARCHS) + sorted(ARCHS_V2), default='tiny',
                   help='v2-*: SwinV2, whose continuous position bias is drawn per head at the '
                   'pretrained and the model window (cpb_surfaces_*)')
    p.add_argument('--pretrained-window-size', type=int, nargs='+', default=[0],
                   help='SwinV2: window the weights were trained with (0: the window)')
    p.add_argument('--window-size', type=int, nargs='+', default=[7], help='M or Mh Mw')
    p.add_argument('--checkpoint', help='weights (any format the loader reads); none: fresh')
    p.add_argument('--allow-pickle', action='store_true',
                   help='let the checkpoint run pickled code (only for files you trust)')
    p.add_argument('--stages', type=int, nargs='+', help='stages to draw (default: all)')
    p.add_argument('--block', type=int, default=0, help='block within each stage')
    p.add_argument('--head', type=int, default=0, help='head for the matrix and attention')
    p.add_argument('--mask-size', type=int, nargs=2, default=[14, 14], metavar=('HP', 'WP'),
                   help='padded map size for the shift-mask picture')
    p.add_argument('--image', help='image for the attention picture (default: a made one)')
    p.add_argument('--shape', type=int, nargs=2, default=[224, 224], metavar=('H', 'W'),
                   help='input size the image is resized to')
    p.add_argument('--query', type=int, nargs=2, metavar=('Y', 'X'),
                   help="query token on the stage's map (default: its centre)")
    p.add_argument('--seed', type=int, default=0, help='seed of a fresh model (reproducible)')
    p.add_argument('--out', default='work_dirs/visualize_rpe', help='output directory')
    return p.parse_args(argv)


def load_image(path, hw):
    """([1, 3, H, W] normalised input, [H, W, 3] uint8 RGB) from a file or a made picture."""
    import mmcv
    h, w = hw
    if path:
        if not os.path.isfile(path):
            raise FileNotFoundError(f'image not found: {path!r}')
        rgb = mmcv.imresize(mmcv.imread(path, channel_order='rgb'), (w, h))
    else:  # a gradient with two blocks: something with edges to look at
        rgb = np.zeros((h, w, 3), np.uint8)
        rgb[:] = np.linspace(30, 220, w, dtype=np.uint8)[None, :, None]
        rgb[h // 5:h // 2, w // 6:w // 2] = (200, 60, 40)
        rgb[h // 2:4 * h // 5, w // 2:5 * w // 6] = (40, 90, 200)
    x = (rgb.astype(np.float32) - IMAGENET_MEAN) / IMAGENET_STD
    return torch.from_numpy(x).permute(2, 0, 1)[None].float(), torch.from_numpy(rgb)


def fail(option: str, err: Exception):
    """One line naming the option, exit code 2."""
    print(f'error: {option}: {str(err).strip(chr(34))}', file=sys.stderr)
    sys.exit(2)


def main(argv=None) -> list:
    args = parse_args(argv)
    window = args.window_size[0] if len(args.window_size) == 1 else tuple(args.window_size)
    torch.manual_seed(args.seed)
    try:
        if args.arch in ARCHS_V2:
            pretrained = args.pretrained_window_size
            model = SwinTransformerV2(**ARCHS_V2[args.arch], window_size=window,
                                      drop_path_rate=0.0,
                                      pretrained_window_size=pretrained[0] if len(pretrained) == 1
                                      else tuple(pretrained))
        else:
            model = SwinTransformer(**ARCHS[args.arch], window_size=window, drop_path_rate=0.0)
    except (ValueError, TypeError) as err:
        fail('--window-size', err)
    if args.checkpoint:
        try:
            load_pretrained(model, args.checkpoint, strict=False, allow_pickle=args.allow_pickle)
        except (FileNotFoundError, KeyError, ValueError, TypeError, UnsafeCheckpointError) as err:
            fail('--checkpoint', err)
    else:
        model.init_weights()
    model.eval()
    stages = args.stages if args.stages is not None else list(range(len(model.stages)))
    try:
        image, rgb = load_image(args.image, args.shape)
    except FileNotFoundError as err:
        fail('--image', err)
    for s in stages:  # out-of-range stage, block or head: named before anything is drawn
        try:
            rpe_plots.bias_matrix(model, s, args.block, args.head)
        except ValueError as err:
            fail('--stages/--block/--head', err)
    os.makedirs(args.out, exist_ok=True)
    shift = model.stages[0].blocks[min(1, len(model.stages[0].blocks) - 1)].shift_size
    jobs = [(f'shift_mask_{args.mask_size[0]}x{args.mask_size[1]}.png', rpe_plots.plot_shift_mask,
             (tuple(args.mask_size), model.stages[0].window_size, shift))]
    for s in stages:
        tag = f'stage{s}_block{args.block}'
        query = tuple(args.query) if args.query else None
        tables = (f'cpb_surfaces_{tag}.png', cpb_plots.plot_cpb_surfaces) \
            if args.arch in ARCHS_V2 else (f'rpe_tables_{tag}.png', rpe_plots.plot_bias_tables)
        jobs += [
            (*tables, (model, s), dict(block=args.block)),
            (f'rpe_matrix_{tag}_head{args.head}.png', rpe_plots.plot_bias_matrix,
             (model, s, args.block, args.head)),
            (f'attention_{tag}_head{args.head}.png', rpe_plots.plot_attention,
             (model, image, rgb, s, args.block, args.head, query)),
        ]
    written = []
    for name, plot, *rest in tqdm(jobs, desc='pictures', disable=len(jobs) < 4):
        kwargs = rest[1] if len(rest) > 1 else {}
        path = os.path.join(args.out, name)
        rpe_plots.close(plot(*rest[0], path=path, **kwargs))
        written.append(path)
    print('\n'.join(written))
    return written


if __name__ == '__main__':
    main()
