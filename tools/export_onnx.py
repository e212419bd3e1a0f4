"""Export a backbone, backbone + neck, or whole model of a config to ONNX with dynamic batch,
height and width, then check the file with ONNX Runtime against PyTorch at several sizes;
optionally convert it to OpenVINO IR (f32, with the bf16 hint's error reported) and int8.

    .venv/bin/python tools/export_onnx.py CONFIG [--checkpoint CKPT] --out FILE
        [--part backbone|neck|model] [--shape H W] [--batch N] [--opset N]
        [--exporter dynamo|classic] [--fixed-size] [--tolerance T] [--cfg-options k=v ...]
        [--openvino] [--int8 IMAGE_DIR [--calibration-count N]] [--threads N]

--openvino writes FILE's OpenVINO IR beside it (FILE.xml + .bin, batch, height and width
dynamic) and checks it like the ONNX file with the f32 hint (held to --tolerance) and the bf16
hint (reported). --int8 IMAGE_DIR also quantizes the IR with NNCF, calibrated on the images of
IMAGE_DIR (e.g. data/synthetic/coco/train), writes FILE_int8.xml and reports its relative error
and cosine per output on images of IMAGE_DIR it was not calibrated on. --evaluate DATA_ROOT (with
--checkpoint, --part backbone or neck) runs the config's test set from DATA_ROOT as tools/test.py
does, eagerly and with the exported part in OpenVINO f32 (and int8), and prints the metrics.
Needs requirements/deploy.txt.

Without --checkpoint the weights stay as built (no init_cfg file is read). --checkpoint takes a
whole detector or segmentor as tools/train.py saves it (any --part), or a backbone alone in any
format swin_rpe_plugin.checkpoint reads (--part backbone); see swin_rpe_plugin/deploy/weights.py.
The check runs the
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

import numpy as np
import torch
from mmengine.config import DictAction

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from swin_rpe_plugin.checkpoint import UnsafeCheckpointError  # noqa: E402
from swin_rpe_plugin.deploy import (DEFAULT_EXPORTER, EXPORTERS, PARTS, build_export_part,  # noqa: E402
                                    check_sizes, export_onnx, get_runtime, verify_onnx)
from swin_rpe_plugin.engine import UsageError  # noqa: E402


HELD_OUT = 4  # images that check int8


def openvino_checks(args, module, inputs) -> float:
    """Write the IR (and int8 IR), print each precision's check; the f32 worst diff."""
    from swin_rpe_plugin.deploy import openvino as ovd
    from swin_rpe_plugin.deploy.calibration import calibration_batches
    from swin_rpe_plugin.deploy.openvino_check import bf16_note, check, float64_note, quantize
    model = ovd.read_onnx(args.out)
    base = os.path.splitext(args.out)[0]
    ovd.save_ir(model, base + '.xml')
    print(f'openvino {ovd.version()} IR: {base}.xml (+ .bin), input '
          f'{", ".join(ovd.dynamic_dims(model))}, CPU: {ovd.cpu_name()}')
    f32 = check(model, module, inputs, 'f32', args.threads)
    bf16 = check(model, module, inputs, 'bf16', args.threads)
    print('\n'.join(f32.lines()))
    for x, diffs in zip(inputs, f32.max_abs_diff):
        if max(diffs) > args.tolerance:
            print(float64_note(module, model, x))
    print('\n'.join(bf16.lines() + [bf16_note(bf16)]))
    if args.int8:
        # int8 is judged on images of the same folder that did not calibrate it (noise is
        # not what it was calibrated for); the f32 IR on the same images is the baseline
        images = calibration_batches(args.int8, module.model.data_preprocessor, args.shape,
                                     args.calibration_count + HELD_OUT)
        calibration, held_out = images[:args.calibration_count], images[args.calibration_count:]
        quantized, count = quantize(model, calibration)
        ovd.save_ir(quantized, base + '_int8.xml')
        print(f'int8 (NNCF, {count} FakeQuantize nodes, calibrated on {len(calibration)} '
              f'images of {args.int8}): {base}_int8.xml')
        if not held_out:
            print(f'int8: {args.int8} has no images beyond the {len(calibration)} that '
                  'calibrated it: checked on those')
        held_out = torch.from_numpy(np.concatenate(held_out or calibration[-HELD_OUT:]))
        print('\n'.join(check(quantized, module, [held_out], 'int8', args.threads).lines()))
    if args.evaluate:
        models = {'openvino f32': model, **({'openvino int8': quantized} if args.int8 else {})}
        evaluate(args, models)
    return f32.worst()


def evaluate(args, models) -> None:
    """Print the test-set metrics eagerly and with the part in each OpenVINO model."""
    import tempfile

    from swin_rpe_plugin.deploy import openvino as ovd
    from swin_rpe_plugin.deploy.runtime_eval import (build_test_runner, metrics_with_runtime,
                                                     test_metrics)
    with tempfile.TemporaryDirectory() as work:
        runner = build_test_runner(args.config, args.checkpoint, work, args.evaluate,
                                   args.cfg_options)
        results = {'eager fp32': test_metrics(runner)}
        for name, model in models.items():
            precision = name.split()[-1]
            run = ovd.compile_run(model, precision, args.threads)
            results[name] = metrics_with_runtime(runner, args.part, run)
    base = results['eager fp32']
    for name, metrics in results.items():
        print(f'{args.part} in {name}: ' + ', '.join(
            f'{k}={v:.4f}' + (f' ({v - base[k]:+.4f})' if name != 'eager fp32' else '')
            for k, v in metrics.items()))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('config')
    p.add_argument('--checkpoint', help='a whole model saved by tools/train.py, or a backbone in '
                   'any format swin_rpe_plugin.checkpoint reads')
    p.add_argument('--allow-pickle', action='store_true',
                   help='load a pickled checkpoint that needs code to load (trusted files only)')
    p.add_argument('--out', required=True, help='the .onnx file to write')
    p.add_argument('--part', choices=PARTS, default='backbone')
    p.add_argument('--shape', type=int, nargs=2, default=(224, 224), metavar=('H', 'W'))
    p.add_argument('--batch', type=int, default=1)
    p.add_argument('--opset', type=int, default=18)
    p.add_argument('--exporter', choices=EXPORTERS, default=DEFAULT_EXPORTER,
                   help=f'default: {DEFAULT_EXPORTER} (dynamo needs torch >= 2.5)')
    p.add_argument('--fixed-size', action='store_true',
                   help='dynamic batch only: for heads with adaptive pooling (UperNet)')
    p.add_argument('--tolerance', type=float, default=1e-4)
    p.add_argument('--cfg-options', nargs='+', action=DictAction)
    p.add_argument('--openvino', action='store_true', help='also write and check OpenVINO IR')
    p.add_argument('--int8', metavar='IMAGE_DIR',
                   help='also quantize the IR to int8 with NNCF, calibrated on these images')
    p.add_argument('--calibration-count', type=int, default=32,
                   help='how many images of IMAGE_DIR calibrate int8')
    p.add_argument('--threads', type=int, help='runtime threads (default: the runtime decides)')
    p.add_argument('--evaluate', metavar='DATA_ROOT',
                   help='test-set metrics with the exported part in OpenVINO (as tools/test.py)')
    args = p.parse_args(argv)
    if min(args.shape) < 1 or args.batch < 1 or args.calibration_count < 1:
        p.error('--shape, --batch and --calibration-count must be positive')
    try:
        if args.checkpoint and not os.path.isfile(args.checkpoint):
            raise UsageError(f'--checkpoint: file not found: {args.checkpoint!r}')
        module = build_export_part(args.config, args.part, args.checkpoint, args.cfg_options,
                                   args.allow_pickle)
        if args.exporter == 'dynamo' and DEFAULT_EXPORTER != 'dynamo':
            raise UsageError(f'--exporter dynamo needs torch >= 2.5, this is {torch.__version__}: '
                             'use --exporter classic')
        if args.fixed_size and args.exporter == 'classic':
            raise UsageError('--fixed-size needs --exporter dynamo: the classic exporter traces '
                             'sizes as tensors, so the heads never see a fixed size')
        if args.openvino or args.int8 or args.evaluate:
            missing = get_runtime('openvino').available()
            if missing:
                raise UsageError(f'--openvino: {missing}')
        if args.evaluate and not (args.checkpoint and args.part in ('backbone', 'neck')):
            raise UsageError('--evaluate needs --checkpoint (the trained model) and --part '
                             'backbone or neck (the heads stay eager)')
        if args.int8:
            from swin_rpe_plugin.deploy.calibration import image_files
            image_files(args.int8)  # a wrong folder fails now, not after the export
        reason = module.fixed_size_reason()
        if reason and not args.fixed_size:
            raise UsageError(f'--part {args.part} of {args.config}: {reason}; export it with '
                             '--fixed-size (dynamic batch only) or export --part backbone')
    except (UsageError, ValueError, KeyError, UnsafeCheckpointError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f'error: {message}', file=sys.stderr)
        return 2
    print(module.weights_report)
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
    if args.openvino or args.int8 or args.evaluate:
        try:
            worst = max(worst, openvino_checks(args, module, inputs))
        except ValueError as err:  # what OpenVINO cannot take, in one line
            print(f'error: {err}', file=sys.stderr)
            return 2
    verdict = 'ok' if worst <= args.tolerance else 'MISMATCH'
    print(f'{verdict}: max abs diff {worst:.1e} (tolerance {args.tolerance:g})')
    return 0 if worst <= args.tolerance else 1


if __name__ == '__main__':
    sys.exit(main())
