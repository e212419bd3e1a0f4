"""Parameters and multiply-adds of Swin attention, of a Swin variant, or of a whole config.

    .venv/bin/python tools/complexity.py --feature 112 112 128 --windows 1 2 3 4 5 6 7
    .venv/bin/python tools/complexity.py --arch tiny --shape 224 224
    .venv/bin/python tools/complexity.py --config configs/swin_rpe/mask-rcnn_... --shape 800 1280

Counts are mmengine's (FlopAnalyzer with an SDPA handle, parameter_count); 1 multiply-add = 1
FLOP. ``--json PATH`` writes the numbers (msa_flops, wmsa_flops, params, flops, ...).
"""
import argparse
import json
import os
import sys

import torch

from swin_rpe_plugin.cli import ArgumentParser
from swin_rpe_plugin.analysis import (ARCHS, ARCHS_V2, CONVENTION, attention_table,
                                      build_classifier, build_from_config, config_inputs,
                                      count_complexity)
from swin_rpe_plugin.analysis.models import PUBLISHED, published_for_config


def parse_args(argv=None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__.split('\n')[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument('--feature', nargs=3, type=int, metavar=('H', 'W', 'C'),
                      help='one attention layer on an H x W x C map: global vs window MSA')
    mode.add_argument('--arch', choices=sorted(ARCHS) + sorted(ARCHS_V2),
                      help='a published Swin (or SwinV2: v2-*) variant with its classification '
                      'head')
    mode.add_argument('--config', help='an mmdet/mmseg config (whole detector/segmentor)')
    p.add_argument('--windows', nargs='+', type=int, default=[7], help='window sizes M')
    p.add_argument('--shape', nargs=2, type=int, metavar=('H', 'W'), help='input size')
    p.add_argument('--window-size', type=int, help='override the backbone window (--arch)')
    p.add_argument('--explicit-attention', action='store_true',
                   help='count with fused_attention=False (same numbers: a self-check)')
    p.add_argument('--json', metavar='PATH', help='write the numbers as JSON')
    return p.parse_args(argv)


def feature_report(h: int, w: int, c: int, windows) -> dict:
    table = attention_table(h, w, c, windows)
    msa = table['msa_flops']
    print(f'One attention layer on a {h}x{w}x{c} map, millions of multiply-adds ({CONVENTION})')
    print(f'  MSA   4hwC^2 + 2(hw)^2C   {msa / 1e6:14.4f}')
    for m, v in table['wmsa_flops'].items():
        print(f'  W-MSA M={m:<3} 4hwC^2 + 2M^2hwC {v / 1e6:12.4f}   ({msa / v:6.1f}x less)')
    return dict(table, unit='multiply-adds (1 MAC = 1 FLOP)', feature=[h, w, c])


def model_report(model, inputs, backbone, prefix: str, hw, title: str) -> dict:
    result = count_complexity(model, inputs, backbone, prefix, hw)
    print(f'{title} at {hw[0]}x{hw[1]}: {result["params"] / 1e6:.3f} M params, '
          f'{result["flops"] / 1e9:.3f} G FLOPs ({CONVENTION})')
    if 'backbone' in result:
        print(f'\nBackbone by stage, G multiply-adds (attention = q@k^T + attn@v; formula '
              f'= 2*Mh*Mw*Hp*Wp*C per block on the window-padded map):')
        print(f'  {"part":<12}{"params M":>10}{"linear":>10}{"attention":>11}{"formula":>10}'
              f'{"rest":>9}{"total":>10}')
        for name, row in result['backbone'].items():
            formula = row.get('attention_formula')
            print(f'  {name:<12}{row["params"] / 1e6:10.3f}{row["linear"] / 1e9:10.4f}'
                  f'{row["attention"] / 1e9:11.4f}'
                  f'{"" if formula is None else f"{formula / 1e9:.4f}":>10}'
                  f'{row["rest"] / 1e9:9.4f}{row["total"] / 1e9:10.4f}')
    print('\nBy top-level module:')
    for name, row in result['by_module'].items():
        print(f'  {name:<20}{row["params"] / 1e6:10.3f} M params{row["flops"] / 1e9:12.3f} G')
    skipped = ', '.join(sorted(k.replace('aten::', '') for k in result['unsupported_ops']))
    print(f'\nNot counted (no mmengine handle; element-wise or custom ops): {skipped}')
    return result


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.feature:
        out = feature_report(*args.feature, args.windows)
    elif args.arch:
        v2 = args.arch in ARCHS_V2
        native = (256, 256) if v2 else (224, 224)
        hw = tuple(args.shape or native)
        overrides = dict(fused_attention=not args.explicit_attention)
        if args.window_size:
            overrides['window_size'] = args.window_size
        model = build_classifier(args.arch, **overrides)
        out = model_report(model, (torch.zeros(1, 3, *hw),), model.backbone, 'backbone.', hw,
                           f'Swin{"V2" if v2 else ""}-{args.arch[-4 if v2 else 0].upper()} '
                           'classifier (1000 classes)')
        params_m, gflops = PUBLISHED[args.arch]
        native_window = 8 if v2 else 7
        if hw == native and args.window_size in (None, native_window):  # what was published
            source = ('SwinV2 model zoo, 256x256, window 8' if v2
                      else 'Swin paper, Table 1, 224x224, window 7')
            print(f'Published ({source}; not measured here): '
                  f'{params_m} M params, {gflops} G FLOPs; this count differs by '
                  f'{out["params"] / 1e6 / params_m - 1:+.2%} params, '
                  f'{out["flops"] / 1e9 / gflops - 1:+.2%} FLOPs')
    else:
        if not args.shape:
            print('error: --config needs --shape H W (e.g. 800 1280 for COCO)', file=sys.stderr)
            sys.exit(2)
        from swin_rpe_plugin.engine import UsageError, load_config
        options = {'model.backbone.fused_attention': False} if args.explicit_attention else {}
        try:  # a missing file or a config mmengine cannot merge: one line
            cfg = load_config(args.config, options)
        except UsageError as err:
            print(f'error: --config: {err}', file=sys.stderr)
            sys.exit(2)
        hw = tuple(args.shape)
        model = build_from_config(cfg)
        inputs, samples = config_inputs(model, hw)
        # The get_flops recipe of mmdet/mmseg: trace forward(inputs, data_samples, 'tensor').
        model.forward = lambda x, _f=model.forward: _f(x, samples, mode='tensor')
        out = model_report(model, (inputs,), getattr(model, 'backbone', None), 'backbone.', hw,
                           os.path.basename(args.config))
        published = published_for_config(args.config, hw)
        if published:
            print('\n' + published)
    if args.json:
        keep = {k: v for k, v in out.items() if k != 'unsupported_ops'}
        with open(args.json, 'w') as f:
            json.dump(keep, f, indent=1)
        print(f'wrote {args.json}')
    return out


if __name__ == '__main__':
    main()
