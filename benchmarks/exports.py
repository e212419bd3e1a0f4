"""Runtime comparison: exported backbones in a CPU runtime (ONNX Runtime, OpenVINO) beside eager.

Our backbone is exported once with dynamic batch and size (at 224x224) and serves every shape;
mmdet's is exported at each fixed size (the best its export can do: its dynamic export fails at
any other size). Each record times, in the same interleaved rounds and with the same weights,
mmdet eager, ours eager, mmdet's fixed export and our dynamic export in one runtime and one
precision; the max diff and cosine of each export against its own eager model are in the
record. The runtime adapters (load, precisions this CPU runs) are ``deploy.runtimes``'; the
exports are ``deploy.onnx``'s.
"""
import os
import tempfile
from typing import Dict, Optional, Tuple

import torch

from .backbone import backbone_gflops, build_pair, max_abs_diff, step_fn
from .runner import Comparison

__all__ = ['RuntimeExports']

EXPORT_HW = (224, 224)  # where our dynamic export is made; it runs at every other size


class RuntimeExports:
    """One model pair and its exports for the runtime comparisons of a run (a context manager:
    the files live in a temporary folder removed on exit)."""

    def __init__(self, arch: str, threads: Optional[int] = None, exporter: str = 'classic'):
        self.arch, self.threads, self.exporter = arch, threads, exporter
        self.stock, self.ours = build_pair(arch)
        self.stock.eval(), self.ours.eval()
        self._tmp = tempfile.TemporaryDirectory()
        self._fixed: Dict[tuple, str] = {}
        self._ours_path: Optional[str] = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._tmp.cleanup()

    def ours_path(self) -> str:
        """Our backbone exported once with dynamic batch, height and width."""
        from swin_rpe_plugin.deploy import ExportPart, export_onnx
        if self._ours_path is None:
            self._ours_path = os.path.join(self._tmp.name, 'ours.onnx')
            export_onnx(ExportPart(self.ours, 'backbone'), torch.randn(1, 3, *EXPORT_HW),
                        self._ours_path, self.exporter)
        return self._ours_path

    def mmdet_path(self, shape: Tuple[int, int], batch: int) -> str:
        """mmdet's backbone exported at this fixed input size."""
        from swin_rpe_plugin.deploy import ExportPart
        key = (tuple(shape), batch)
        if key not in self._fixed:
            path = os.path.join(self._tmp.name, f'mmdet_{shape[0]}x{shape[1]}_b{batch}.onnx')
            with torch.no_grad():
                torch.onnx.export(ExportPart(self.stock, 'backbone'),
                                  (torch.randn(batch, 3, *shape), ), path, dynamo=False,
                                  opset_version=18, input_names=['input'])
            self._fixed[key] = path
        return self._fixed[key]

    def comparison(self, runtime, precision: str, shape: Tuple[int, int],
                   batch: int) -> Comparison:
        """One record: both exports in ``runtime`` at ``precision`` against both eager models.

        int8 is calibrated on a few random inputs of this shape: enough for its speed, not for
        its accuracy (``tools/export_onnx.py`` calibrates on images).
        """
        x = torch.randn(batch, 3, *shape)
        calibration = [torch.randn(batch, 3, *shape).numpy() for _ in range(4)] \
            if precision == 'int8' else None
        runs = {who: runtime.load(path, precision, self.threads, calibration)
                for who, path in (('ours', self.ours_path()),
                                  ('mmdet', self.mmdet_path(shape, batch)))}
        steps = {'mmdet': step_fn(self.stock, 'infer'), 'ours': step_fn(self.ours, 'infer')}
        name = runtime.name
        for who, run in runs.items():
            steps[f'{who}_{name}'] = lambda t, run=run: run(t.numpy())
        checks = {}
        for who in ('ours', 'mmdet'):
            got = [torch.from_numpy(o) for o in steps[f'{who}_{name}'](x)]
            eager = steps[who](x)
            checks[f'{who}_{name}_max_abs_diff'] = max_abs_diff(got, eager)
            checks[f'{who}_{name}_cosine'] = min(  # worst output; int8's accuracy in one number
                torch.nn.functional.cosine_similarity(a.flatten().double(),
                                                      b.flatten().double(), 0).item()
                for a, b in zip(got, eager))
        checks['max_abs_diff'] = checks[f'ours_{name}_max_abs_diff']
        key = dict(kind='runtime', arch=self.arch, shape=list(shape), batch=batch, mode='infer',
                   dtype='fp32', runtime=name, precision=precision,
                   note=f'ours: one dynamic export at {EXPORT_HW[0]}x{EXPORT_HW[1]}; mmdet: '
                   'exported at this size')
        return Comparison(key, steps, x, baseline=f'mmdet_{name}', candidate=f'ours_{name}',
                          gflops=backbone_gflops(self.stock, shape, batch),
                          roof_dtype='bf16' if precision == 'bf16' else 'fp32', checks=checks)
