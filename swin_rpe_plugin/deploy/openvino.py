"""OpenVINO from our ONNX export: convert to IR, compile at a precision hint, quantize to int8.

Everything here is OpenVINO's and NNCF's own API: ``openvino.convert_model`` reads the ONNX file
(its dynamic batch, height and width stay dynamic in the IR), ``openvino.save_model`` writes the
IR (with ``compress_to_fp16=False``: its default halves the weights, which would change the f32
results), ``Core.compile_model`` compiles for the CPU with ``INFERENCE_PRECISION_HINT`` and
``nncf.quantize`` does post-training int8 quantization. OpenVINO's CPU plugin runs the bf16 hint
only where the CPU has native bf16 (``OPTIMIZATION_CAPABILITIES`` lists ``BF16``); elsewhere it
runs f32, and ``compiled_precision`` says which it chose.
"""
from functools import lru_cache
from typing import Iterable, List, Optional, Tuple

import numpy as np

HINTS = {'f32': 'f32', 'bf16': 'bf16', 'int8': 'f32'}  # int8: quantized ops, f32 elsewhere


@lru_cache(maxsize=1)
def core():
    import openvino as ov
    return ov.Core()


def cpu_capabilities() -> Tuple[str, ...]:
    """What OpenVINO's CPU plugin says this CPU can run: e.g. ('FP32', 'INT8', 'BIN', ...)."""
    return tuple(core().get_property('CPU', 'OPTIMIZATION_CAPABILITIES'))


def version() -> str:
    import openvino as ov
    return ov.__version__.split('-')[0]


def cpu_name() -> str:
    return str(core().get_property('CPU', 'FULL_DEVICE_NAME'))


def _first_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    # OpenVINO's messages start with 'Exception from src/...cpp:NN:' and the cause follows
    useful = [line for line in lines if not line.startswith(('Exception from', 'Check '))]
    return (useful or lines or [type(err).__name__])[0][:300]


def read_onnx(onnx_path: str):
    """The ONNX file as an ``openvino.Model``; a one-line ValueError if OpenVINO cannot take it."""
    import openvino as ov
    try:
        return ov.convert_model(onnx_path)
    except Exception as err:  # OpenVINO raises its own error types from C++
        raise ValueError(f'OpenVINO cannot convert {onnx_path}: {_first_line(err)}') from None


def dynamic_dims(model) -> List[str]:
    """Per input, its shape as OpenVINO sees it, e.g. '[?,3,?,?]'."""
    return [str(inp.get_partial_shape()) for inp in model.inputs]


def save_ir(model, xml_path: str) -> None:
    """Write the IR (``.xml`` + ``.bin``) with f32 weights kept f32."""
    import openvino as ov
    ov.save_model(model, xml_path, compress_to_fp16=False)


def read_ir(xml_path: str):
    return core().read_model(xml_path)


def compile_model(model, precision: str = 'f32', threads: Optional[int] = None):
    if precision not in HINTS:
        raise ValueError(f'precision must be one of {tuple(HINTS)}, got {precision!r}')
    config = {'INFERENCE_PRECISION_HINT': HINTS[precision], 'PERFORMANCE_HINT': 'LATENCY'}
    if threads:
        config['INFERENCE_NUM_THREADS'] = int(threads)
    return core().compile_model(model, 'CPU', config)


def compiled_precision(compiled) -> str:
    """The inference precision the CPU plugin chose for a compiled model: 'f32' or 'bf16'."""
    chosen = compiled.get_property('INFERENCE_PRECISION_HINT')  # an openvino.Type
    return chosen.to_string() if hasattr(chosen, 'to_string') else str(chosen)


def runner(compiled):
    """``run(images) -> outputs`` over one infer request of ``compiled`` (outputs copied: the
    request reuses its buffers on the next call)."""
    request = compiled.create_infer_request()
    count = len(compiled.outputs)

    def run(images: np.ndarray) -> List[np.ndarray]:
        try:
            request.infer({0: np.ascontiguousarray(images, np.float32)})
        except Exception as err:  # e.g. a size a fixed-size export does not take
            raise ValueError(f'OpenVINO cannot run input {list(images.shape)}: '
                             f'{_first_line(err)}') from None
        return [request.get_output_tensor(i).data.copy() for i in range(count)]

    return run


def compile_run(model, precision: str = 'f32', threads: Optional[int] = None):
    return runner(compile_model(model, precision, threads))


def quantize_int8(model, calibration: Iterable[np.ndarray], subset_size: Optional[int] = None):
    """NNCF post-training int8 quantization of an OpenVINO model.

    ``model_type=TRANSFORMER`` is NNCF's scheme for attention models (softmax, layer norm and
    the attention's matmul with the bias kept out of int8 where that costs accuracy); the
    calibration images are NCHW float32 batches, preprocessed as the model expects."""
    import nncf
    items = [np.ascontiguousarray(x, np.float32) for x in calibration]
    if not items:
        raise ValueError('int8 calibration needs at least one image batch')
    return nncf.quantize(model, nncf.Dataset(items), model_type=nncf.ModelType.TRANSFORMER,
                         subset_size=subset_size or len(items))
