"""Deployment timings of the Swin-T backbone, in one process and with the same weights: mmdet
eager fp32, ours eager fp32, our dynamic export (made once at 224x224) in ONNX Runtime and in
OpenVINO at each precision this CPU runs, with the max abs diff and cosine against our eager.

    flock /tmp/swin_bench.lock .venv/bin/python -m swin_rpe_plugin.deploy.timing \\
        [--threads 2] [--repeats 5] [--calibration DIR] [--out timings.json]

Runs are interleaved (one of each per round) so that load on a shared machine hits all alike;
each figure is the median of ``--repeats`` rounds after one warm-up run. The int8 model is
calibrated on ``--calibration`` images at 224x224 (preprocessed with ImageNet mean/std, as the
configs' data preprocessors do) or, without it, on random normal images (fine for timing; its
error figures are then on noise).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .compare import agreement, max_abs_diffs
from .onnx import ExportPart, export_onnx
from .runtimes import get_runtime

CASES = (((512, 512), 2), ((800, 1216), 1))
EXPORT_SIZE = (224, 224)


def _calibration(folder: Optional[str], count: int = 16) -> List[np.ndarray]:
    if folder is None:
        rng = np.random.default_rng(0)
        return [rng.standard_normal((1, 3, *EXPORT_SIZE), dtype=np.float32)
                for _ in range(count)]
    from mmdet.models.data_preprocessors import DetDataPreprocessor

    from .calibration import calibration_batches
    preprocessor = DetDataPreprocessor(mean=[123.675, 116.28, 103.53],
                                       std=[58.395, 57.12, 57.375], bgr_to_rgb=True)
    return calibration_batches(folder, preprocessor, EXPORT_SIZE, count)


def _median_ms(runs: Dict[str, Callable], x, repeats: int) -> Dict[str, float]:
    for run in runs.values():
        run(x)
    times: Dict[str, List[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run(x)
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def deployment_timings(cases: Sequence[Tuple[Tuple[int, int], int]] = CASES, repeats: int = 5,
                       threads: int = 2, calibration: Optional[str] = None,
                       exporter: str = 'dynamo') -> List[dict]:
    from ..analysis.benchmark import build_pair
    torch.set_num_threads(threads)
    stock, ours = build_pair('tiny')
    stock.eval(), ours.eval()
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, 'ours.onnx')
        part = ExportPart(ours, 'backbone')
        export_onnx(part, torch.randn(1, 3, *EXPORT_SIZE), path, exporter)
        runtimes: Dict[str, Callable] = {
            'onnxruntime f32': get_runtime('onnxruntime').load(path, 'f32', threads)}
        openvino = get_runtime('openvino')
        for precision in openvino.precisions():
            runtimes[f'openvino {precision}'] = openvino.load(
                path, precision, threads,
                calibration=_calibration(calibration) if precision == 'int8' else None)
        for shape, batch in cases:
            x = torch.randn(batch, 3, *shape)
            with torch.no_grad():
                eager = [t.numpy() for t in ours(x)]
            runs = {'mmdet eager fp32': lambda x: stock(torch.from_numpy(x)),
                    'ours eager fp32': lambda x: ours(torch.from_numpy(x)), **runtimes}
            with torch.no_grad():
                ms = _median_ms(runs, x.numpy(), repeats)
            diff, cosine = {}, {}
            for name, run in runtimes.items():
                got = run(x.numpy())
                diff[name] = max(max_abs_diffs(got, eager))
                cosine[name] = min(a['cosine'] for a in agreement(got, eager))
            records.append(dict(shape=list(shape), batch=batch, threads=threads,
                                exporter=exporter, ms=ms, max_abs_diff=diff, cosine=cosine))
    return records


def table(records: Sequence[dict]) -> str:
    lines = []
    for r in records:
        ms = r['ms']
        base, mmdet = ms['ours eager fp32'], ms['mmdet eager fp32']
        lines.append(f'{r["batch"]}x3x{r["shape"][0]}x{r["shape"][1]} ({r["threads"]} threads)'
                     ' | ms | vs ours eager | vs mmdet eager | max abs diff | cosine')
        for name, value in ms.items():
            diff = f'{r["max_abs_diff"][name]:.1e}' if name in r['max_abs_diff'] else ''
            cos = f'{r["cosine"][name]:.6f}' if name in r['cosine'] else ''
            lines.append(f'{name} | {value:.0f} | {base / value:.2f}x | {mmdet / value:.2f}x | '
                         f'{diff} | {cos}')
    return '\n'.join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--repeats', type=int, default=5)
    p.add_argument('--calibration', help='a folder of images to calibrate int8 on')
    p.add_argument('--exporter', choices=('dynamo', 'classic'), default='dynamo')
    p.add_argument('--out', help='also write the records to this JSON file')
    args = p.parse_args(argv)
    from .openvino import cpu_capabilities, cpu_name, version
    print(f'CPU: {cpu_name()}; OpenVINO {version()} OPTIMIZATION_CAPABILITIES: '
          f'{" ".join(cpu_capabilities())}; torch {torch.__version__}')
    records = deployment_timings(repeats=args.repeats, threads=args.threads,
                                 calibration=args.calibration, exporter=args.exporter)
    print(table(records))
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(records, f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main())
