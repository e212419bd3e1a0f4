"""Train a detector or segmentor: the CLI of mmdet's and mmseg's tools/train.py.

    .venv/bin/python tools/train.py CONFIG [--work-dir DIR] [--data-root DIR] [--resume [CKPT]]
        [--amp [--amp-dtype {bf16,fp16}]] [--cfg-options k=v ...]
        [--launcher {none,pytorch,slurm,mpi}]

The toolkit (mmdet or mmseg) comes from the config's default_scope. --amp trains in mixed
precision: bf16 autocast on CPU (swin_rpe_plugin.AutocastOptimWrapper), fp16 with a dynamic
loss scale on CUDA (mmengine's AmpOptimWrapper; --amp-dtype bf16 for bf16). Without CUDA,
SyncBN is converted to BN and distributed runs use gloo (tools/dist_train.sh).
"""
import argparse
import os
import sys

from mmengine.config import DictAction

from swin_rpe_plugin.cli import ArgumentParser
from swin_rpe_plugin.engine import UsageError, train


def parse_args(argv=None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument('--data-root', metavar='DIR',
                        help="the dataset folder: sets every dataset's data_root and the "
                        "evaluators' annotation files (COCO- and ADE20K-style layouts)")
    parser.add_argument('--amp', action='store_true',
                        help='mixed precision: bf16 autocast on CPU, fp16 + loss scale on CUDA')
    parser.add_argument('--amp-dtype', choices=['bf16', 'fp16'],
                        help='autocast dtype for --amp (default: bf16 on CPU, fp16 on CUDA)')
    parser.add_argument('--resume', nargs='?', type=str, const='auto',
                        help='resume from CKPT, or from the latest checkpoint in the work dir')
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
        runner = train(args.config, args.work_dir, args.cfg_options, args.resume, args.amp,
                       args.launcher, args.amp_dtype, data_root=args.data_root)
    except UsageError as err:  # a bad path, argument or key: one line, no traceback
        print(f'error: {err}', file=sys.stderr)
        return 2
    print(f'rank {runner.rank}/{runner.world_size}: training finished, work dir '
          f'{runner.work_dir}', flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
