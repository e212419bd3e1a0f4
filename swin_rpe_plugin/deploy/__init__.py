"""Deployment: ONNX export of the backbone, backbone + neck, or a whole model in tensor mode
(``onnx.py``), and the runtimes that run it on CPU (``runtimes.py``: ONNX Runtime, OpenVINO at
f32, bf16 and int8). Needs onnx, onnxruntime and, for the dynamo exporter, onnxscript; OpenVINO
and int8 need requirements/deploy.txt (openvino, nncf)."""
from .onnx import (DEFAULT_EXPORTER, EXPORTERS, PARTS, ExportPart, build_export_part, check_sizes, export_onnx,
                   verify_onnx)
from .compare import agreement, max_abs_diffs, verify
from .runtimes import PRECISIONS, RUNTIMES, Runtime, get_runtime, onnxruntime_session

__all__ = ['DEFAULT_EXPORTER', 'EXPORTERS', 'PARTS', 'PRECISIONS', 'RUNTIMES', 'ExportPart', 'Runtime', 'agreement',
           'build_export_part', 'check_sizes', 'export_onnx', 'get_runtime', 'max_abs_diffs',
           'onnxruntime_session', 'verify', 'verify_onnx']
