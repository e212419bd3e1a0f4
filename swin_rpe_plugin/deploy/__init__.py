"""Deployment: ONNX export of the backbone, backbone + neck, or a whole model in tensor mode,
verified with ONNX Runtime (needs onnx, onnxruntime and, for the dynamo exporter, onnxscript)."""
from .onnx import (EXPORTERS, PARTS, ExportPart, build_export_part, export_onnx,
                   onnxruntime_session, verify_onnx)

__all__ = ['EXPORTERS', 'PARTS', 'ExportPart', 'build_export_part', 'export_onnx',
           'onnxruntime_session', 'verify_onnx']
