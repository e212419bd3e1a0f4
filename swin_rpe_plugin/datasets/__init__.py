"""Synthetic datasets: generation (numpy + OpenCV only) and thin registered dataset classes.

The dataset classes import mmdet / mmseg, so they live in their own modules, imported by the
configs through ``custom_imports`` (``swin_rpe_plugin.datasets.coco_shapes``,
``swin_rpe_plugin.datasets.ade_shapes``); ``import swin_rpe_plugin`` needs neither toolkit.
"""
from .synthetic import SEG_CLASSES, SEG_PALETTE, SHAPES, make_synthetic_data

__all__ = ['SEG_CLASSES', 'SEG_PALETTE', 'SHAPES', 'make_synthetic_data']
