"""The runtimes that run an exported ONNX file on CPU: one small adapter per runtime.

An adapter describes a runtime; it does not time or verify anything. ``load`` turns an ONNX file
(ours: dynamic batch, height and width) into ``run(images) -> outputs`` at one precision:

- ``'f32'``: full precision;
- ``'bf16'``: OpenVINO's bf16 inference-precision hint (only on CPUs with native bf16: it is
  listed by ``precisions()`` only where ``OPTIMIZATION_CAPABILITIES`` has ``BF16``);
- ``'int8'``: NNCF post-training quantization of the OpenVINO model, calibrated on the images
  given as ``calibration`` (see ``deploy/openvino.py``).

The benchmarks (``benchmarks/exports.py``, beside the package) and ``tools/export_onnx.py`` take a
runtime by name from ``RUNTIMES``.
"""
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np

PRECISIONS = ('f32', 'bf16', 'int8')
RunFn = Callable[[np.ndarray], List[np.ndarray]]


def _missing(package: str, pip_name: str) -> Optional[str]:
    import importlib.util
    if importlib.util.find_spec(package) is None:
        return (f'{pip_name} is not installed: pip install -r requirements/deploy.txt '
                '(pinned versions)')
    return None


class Runtime:
    """An inference runtime that takes an ONNX file."""
    name: str = ''

    def available(self) -> Optional[str]:
        """None if this runtime can be used here, else a one-line reason."""
        raise NotImplementedError

    def precisions(self) -> Tuple[str, ...]:
        """The precisions this runtime runs on this CPU (a subset of ``PRECISIONS``)."""
        raise NotImplementedError

    def load(self, onnx_path: str, precision: str = 'f32', threads: Optional[int] = None,
             calibration: Optional[Iterable[np.ndarray]] = None) -> RunFn:
        """``run(images)``: images NCHW float32 -> the file's outputs, in order."""
        raise NotImplementedError

    def _check(self, precision: str, calibration) -> None:
        reason = self.available()
        if reason:
            raise RuntimeError(f'{self.name}: {reason}')
        if precision not in self.precisions():
            raise ValueError(f'{self.name} runs {", ".join(self.precisions())} on this CPU, '
                             f'not {precision!r}' + self._why_not(precision))
        if precision == 'int8' and calibration is None:
            raise ValueError(f'{self.name} int8 needs calibration images (an iterable of NCHW '
                             'float32 arrays, preprocessed as the model expects)')

    def _why_not(self, precision: str) -> str:
        return ''


def onnxruntime_session(path: str, threads: Optional[int] = None):
    """An ONNX Runtime CPU session; ``threads`` sets its intra-op thread count."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    # ORT's workers spin after each run by default, taking the cores from whatever runs next
    # (in one benchmark round the matmul roof timed after ORT came out so slow that ORT read
    # 1.3-1.4x of it).
    options.add_session_config_entry('session.intra_op.allow_spinning', '0')
    return ort.InferenceSession(path, options, providers=['CPUExecutionProvider'])


class OnnxRuntime(Runtime):
    """ONNX Runtime, CPU execution provider, f32."""
    name = 'onnxruntime'

    def available(self) -> Optional[str]:
        return _missing('onnxruntime', 'onnxruntime')

    def precisions(self) -> Tuple[str, ...]:
        return ('f32', )

    def _why_not(self, precision: str) -> str:
        return ' (reduced precisions: use --runtime openvino)'

    def load(self, onnx_path, precision='f32', threads=None, calibration=None) -> RunFn:
        self._check(precision, calibration)
        session = onnxruntime_session(onnx_path, threads)
        name = session.get_inputs()[0].name

        def run(images: np.ndarray) -> List[np.ndarray]:
            return session.run(None, {name: np.ascontiguousarray(images, np.float32)})

        return run


class OpenVino(Runtime):
    """OpenVINO on CPU: the ONNX file converted in memory (``openvino.convert_model``), compiled
    with the f32 or bf16 inference-precision hint, or quantized to int8 by NNCF first."""
    name = 'openvino'

    def available(self) -> Optional[str]:
        return _missing('openvino', 'openvino')

    def precisions(self) -> Tuple[str, ...]:
        if self.available():
            return ()
        from .openvino import cpu_capabilities
        caps = cpu_capabilities()
        found = ['f32']
        if 'BF16' in caps:
            found.append('bf16')
        if 'INT8' in caps and _missing('nncf', 'nncf') is None:
            found.append('int8')
        return tuple(found)

    def _why_not(self, precision: str) -> str:
        from .openvino import cpu_capabilities
        caps = ' '.join(cpu_capabilities())
        if precision == 'bf16':
            return f' (OPTIMIZATION_CAPABILITIES of this CPU: {caps}; no native bf16)'
        if precision == 'int8':
            return ' (' + (_missing('nncf', 'nncf') or f'OPTIMIZATION_CAPABILITIES: {caps}') + ')'
        return ''

    def load(self, onnx_path, precision='f32', threads=None, calibration=None) -> RunFn:
        self._check(precision, calibration)
        from . import openvino as ovd
        model = ovd.read_onnx(onnx_path)
        if precision == 'int8':
            model = ovd.quantize_int8(model, calibration)
        return ovd.compile_run(model, precision, threads)


RUNTIMES: Dict[str, Runtime] = {r.name: r for r in (OnnxRuntime(), OpenVino())}


def get_runtime(name: str) -> Runtime:
    if name not in RUNTIMES:
        raise ValueError(f'unknown runtime {name!r}: choose one of {", ".join(RUNTIMES)}')
    return RUNTIMES[name]
