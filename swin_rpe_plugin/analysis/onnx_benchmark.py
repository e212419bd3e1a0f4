"""ONNX Runtime timing: our backbone exported once with dynamic sizes against mmdet's Swin
exported at each fixed size (the best mmdet's export can do: its dynamic export fails at any
other size), same weights, interleaved runs in one process."""
import os
import statistics
import tempfile
import time
from typing import List, Sequence, Tuple

import torch

from ..deploy import ExportPart, export_onnx, onnxruntime_session
from .benchmark import build_pair, max_abs_diff


def _median_ms(sessions: dict, feed: dict, repeats: int) -> dict:
    for session in sessions.values():  # warm-up: ORT plans memory and kernels on first run
        session.run(None, feed)
    times = {name: [] for name in sessions}
    for _ in range(repeats):
        for name, session in sessions.items():
            t0 = time.perf_counter()
            session.run(None, feed)
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: (statistics.median(t), max(t) - min(t)) for name, t in times.items()}


def onnx_records(arch: str, cases: Sequence[Tuple[Tuple[int, int], int]], repeats: int,
                 threads: int, exporter: str = 'classic') -> List[dict]:
    """One record per (shape, batch): ours (dynamic) and mmdet (fixed) in ONNX Runtime."""
    stock, ours = build_pair(arch)
    stock.eval(), ours.eval()
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        ours_path = os.path.join(tmp, 'ours.onnx')
        example = torch.randn(1, 3, 224, 224)
        ours_part = ExportPart(ours, 'backbone')
        export_onnx(ours_part, example, ours_path, exporter)
        ours_session = onnxruntime_session(ours_path, threads)
        for shape, batch in cases:
            x = torch.randn(batch, 3, *shape)
            stock_path = os.path.join(tmp, f'mmdet_{shape[0]}x{shape[1]}_b{batch}.onnx')
            with torch.no_grad():
                torch.onnx.export(ExportPart(stock, 'backbone'), (x, ), stock_path,
                                  dynamo=False, opset_version=18, input_names=['input'])
            sessions = {'ours': ours_session,
                        'mmdet': onnxruntime_session(stock_path, threads)}
            feed = {'input': x.numpy()}
            ms = _median_ms(sessions, feed, repeats)
            with torch.no_grad():
                eager = ours(x)
            got = [torch.from_numpy(o) for o in ours_session.run(None, feed)]
            records.append(dict(
                arch=arch, shape=list(shape), batch=batch, mode=f'onnxruntime ({exporter})',
                dtype='fp32', ours_ms=ms['ours'][0], mmdet_ms=ms['mmdet'][0],
                ours_spread_ms=ms['ours'][1], mmdet_spread_ms=ms['mmdet'][1],
                speedup=ms['mmdet'][0] / ms['ours'][0], max_abs_diff=max_abs_diff(got, eager),
                note='ours: one dynamic export at 224x224; mmdet: exported at this size'))
    return records
