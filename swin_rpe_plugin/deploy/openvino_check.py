"""Our ONNX export as OpenVINO IR, checked against eager PyTorch at each precision.

f32 must match eager to a tolerance at every size (one IR, dynamic batch, height and width).
The bf16 hint and int8 are reduced precisions: their error is reported (max abs diff; relative
error and cosine per output), not held to the f32 tolerance. Where the CPU has no native bf16,
OpenVINO's CPU plugin compiles the bf16 hint as f32: the report says so, from the plugin's own
``OPTIMIZATION_CAPABILITIES`` and the compiled model's ``INFERENCE_PRECISION_HINT``.
"""
import dataclasses
from typing import List, Optional, Sequence

import numpy as np
import torch

from . import openvino as ovd
from .compare import agreement, max_abs_diffs


@dataclasses.dataclass
class PrecisionCheck:
    precision: str                 # the hint asked for: 'f32', 'bf16' or 'int8'
    ran_as: str                    # what the CPU plugin compiled ('f32' / 'bf16'; int8: 'int8')
    shapes: List[List[int]]
    max_abs_diff: List[List[float]]          # per input, per output
    agreement: List[List[dict]]              # per input, per output: rel_error, cosine

    def worst(self) -> float:
        return max(max(d) for d in self.max_abs_diff)

    def lines(self) -> List[str]:
        out = []
        for shape, diffs, agree in zip(self.shapes, self.max_abs_diff, self.agreement):
            worst_cos = min(a['cosine'] for a in agree)
            worst_rel = max(a['rel_error'] for a in agree)
            out.append(f'openvino {self.precision} vs pytorch at {"x".join(map(str, shape))}: '
                       f'max abs diff {max(diffs):.1e}, rel error <= {worst_rel:.1e}, '
                       f'cosine >= {worst_cos:.6f}')
        return out


def check(model, module: torch.nn.Module, inputs: Sequence[torch.Tensor], precision: str,
          threads: Optional[int] = None) -> PrecisionCheck:
    """Compile ``model`` (an openvino.Model, int8 already quantized for 'int8') at
    ``precision``'s hint and compare it with ``module`` on each input."""
    compiled = ovd.compile_model(model, precision, threads)
    run = ovd.runner(compiled)
    ran_as = 'int8' if precision == 'int8' else ovd.compiled_precision(compiled)
    diffs, agree = [], []
    for x in inputs:
        with torch.no_grad():
            expected = module(x)
        got = run(x.numpy())
        diffs.append(max_abs_diffs(got, expected))
        agree.append(agreement(got, expected))
    return PrecisionCheck(precision, ran_as, [list(x.shape) for x in inputs], diffs, agree)


def bf16_note(result: PrecisionCheck) -> str:
    caps = ovd.cpu_capabilities()
    if 'BF16' in caps:
        return f'bf16 hint: this CPU has native bf16; the CPU plugin ran {result.ran_as}'
    return (f'bf16 hint: this CPU has no native bf16 (OPTIMIZATION_CAPABILITIES: '
            f'{" ".join(caps)}), so the CPU plugin ran {result.ran_as}: the bf16 numbers above '
            'are f32 numbers; a CPU with avx512_bf16 or AMX runs bf16')


def quantize(model, calibration: Sequence[np.ndarray]):
    """NNCF int8 of ``model``; the quantized model and how many FakeQuantize nodes it holds."""
    quantized = ovd.quantize_int8(model, calibration)
    count = sum(op.get_type_name() == 'FakeQuantize' for op in quantized.get_ops())
    return quantized, count
