"""Write the synthetic COCO-format instance set and ADE20K-format semantic set.

    .venv/bin/python tools/make_synthetic_data.py [OUT_DIR] [--num-train N] [--num-val N]
        [--seed S] [--size H W | --size-range MIN MAX]

OUT_DIR (default data/synthetic) gets coco/ and ade/; the same seed writes the same files.
--size-range draws each image's height and width from MIN..MAX (varied sizes and aspect ratios,
so that batched test images are padded: tools/test.py --batch-size N).
"""
import sys

from swin_rpe_plugin.cli import ArgumentParser
from swin_rpe_plugin.datasets import make_synthetic_data


def main(argv=None) -> int:
    parser = ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('out_dir', nargs='?', default='data/synthetic')
    parser.add_argument('--num-train', type=int, default=200)
    parser.add_argument('--num-val', type=int, default=50)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--size', type=int, nargs=2, default=(128, 128), metavar=('H', 'W'))
    parser.add_argument('--size-range', type=int, nargs=2, metavar=('MIN', 'MAX'),
                        help='draw each image\'s height and width from MIN..MAX instead of '
                        '--size')
    args = parser.parse_args(argv)
    try:
        roots = make_synthetic_data(args.out_dir, args.num_train, args.num_val, args.seed,
                                    tuple(args.size), size_range=args.size_range and
                                    tuple(args.size_range))
    except ValueError as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    print(f'COCO-format set: {roots["coco"]}\nADE20K-format set: {roots["ade"]}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
