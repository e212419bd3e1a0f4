"""mmseg ``ADE20KDataset`` over the synthetic ADE20K-format shapes (only ``metainfo`` differs).

``ADE20KDataset`` refuses classes that are not a subset of its 150, so a subclass sets them;
suffixes (.jpg/.png) and ``reduce_zero_label=True`` are inherited unchanged.
"""
from mmseg.datasets import ADE20KDataset
from mmseg.registry import DATASETS

from .synthetic import SEG_CLASSES, SEG_PALETTE


@DATASETS.register_module()
class ShapesADE20KDataset(ADE20KDataset):
    """The synthetic semantic set: ADE20K layout and label convention, the shape classes."""
    METAINFO = dict(classes=SEG_CLASSES, palette=SEG_PALETTE)
