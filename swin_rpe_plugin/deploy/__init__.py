"""Deployment: ONNX export of the backbone, backbone + neck, or a whole model in tensor mode
(``onnx.py``), and the runtimes that run it on CPU (``runtimes.py``: ONNX Runtime, OpenVINO at
f32, bf16 and int8). Needs onnx, onnxruntime and, for the dynamo exporter, onnxscript; OpenVINO
and int8 need requirements/deploy.txt (openvino, nncf)."""
from .onnx import EXPORTERS, PARTS, ExportPart, build_export_part, export_onnx, verify_onnx
from .runtimes import (PRECISIONS, RUNTIMES, Runtime, get_runtime, max_abs_diffs,
                       onnxruntime_session, verify)

__all__ = ['EXPORTERS', 'PARTS', 'PRECISIONS', 'RUNTIMES', 'ExportPart', 'Runtime',
           'build_export_part', 'export_onnx', 'get_runtime', 'max_abs_diffs',
           'onnxruntime_session', 'verify', 'verify_onnx']
