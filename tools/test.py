"""Evaluate a checkpoint: the CLI of mmdet's and mmseg's tools/test.py.

    .venv/bin/python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--data-root DIR]
        [--batch-size N] [--padding-aware] [--show-dir DIR [--show-interval N]]
        [--out-metrics FILE.json] [--cfg-options k=v ...] [--launcher {none,pytorch,...}]

The toolkit (mmdet or mmseg) comes from the config's default_scope; metrics are the config's
evaluators' (mmdet CocoMetric, mmseg IoUMetric). A checkpoint that does not fit the model is
refused with the first offending key; bias tables saved at another window are resized instead.
--batch-size sets the test dataloader's batch size; --padding-aware turns on the padding-aware
model (docs/padding-aware.md), whose outputs then do not depend on the batch size.
"""
import argparse
import os
import sys

from mmengine.config import DictAction

from swin_rpe_plugin.cli import ArgumentParser
from swin_rpe_plugin.engine import UsageError, test
from swin_rpe_plugin.engine.padding import batch_test_options


def parse_args(argv=None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='the dir to save logs and metrics')
    parser.add_argument('--data-root', metavar='DIR',
                        help="the dataset folder: sets every dataset's data_root and the "
                        "evaluators' annotation files (COCO- and ADE20K-style layouts)")
    parser.add_argument('--batch-size', type=int, metavar='N',
                        help="the test dataloader's batch size (default: the config's)")
    parser.add_argument('--padding-aware', action='store_true',
                        help='mask_padding=True on the backbone and the PaddingAwareHook: '
                        'outputs that do not depend on the batch size')
    parser.add_argument('--show-dir', help='save a picture of ground truth and prediction of '
                        'every image here')
    parser.add_argument('--show-interval', type=int, default=1, metavar='N',
                        help='with --show-dir, draw every N-th image (default 1: all)')
    parser.add_argument('--out-metrics', help='write the metrics to this JSON file')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config settings, key=value (e.g. a.b=1)')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        options = batch_test_options(args.config, args.cfg_options, args.batch_size,
                               args.padding_aware)
        metrics = test(args.config, args.checkpoint, args.work_dir, options,
                       args.show_dir, args.launcher, args.out_metrics,
                       data_root=args.data_root, show_interval=args.show_interval)
    except UsageError as err:  # a bad path, argument or key: one line, no traceback
        print(f'error: {err}', file=sys.stderr)
        return 2
    print(' '.join(f'{k}={v:.4f}' for k, v in metrics.items()))
    return 0


if __name__ == '__main__':
    sys.exit(main())
