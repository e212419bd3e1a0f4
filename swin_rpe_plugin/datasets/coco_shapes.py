"""mmdet ``CocoDataset`` over the synthetic COCO-format shapes (only ``metainfo`` differs)."""
from mmdet.datasets import CocoDataset
from mmdet.registry import DATASETS

from .synthetic import SHAPES


@DATASETS.register_module()
class ShapesCocoDataset(CocoDataset):
    """The synthetic instance set: COCO files, the shape classes."""
    METAINFO = dict(classes=SHAPES,
                    palette=[(220, 20, 60), (0, 128, 255), (60, 180, 75), (255, 200, 0)])
