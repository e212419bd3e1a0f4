"""Calibration images for int8: a folder of pictures, preprocessed as the model's own
``data_preprocessor`` does it (channel order, mean and std), one batch of one image each.

Any folder of images serves (the synthetic sets of ``tools/make_synthetic_data.py``:
``data/synthetic/coco/train``, ``data/synthetic/ade/images/training``; or the deployer's own).
Images are resized to one size (the export size): calibration collects value ranges, which do
not depend on the size, and one size keeps NNCF's statistics on one graph shape.
"""
import os
from typing import List, Optional, Tuple

import numpy as np
import torch.nn as nn

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.tif', '.tiff', '.webp')


def image_files(folder: str, limit: Optional[int] = None) -> List[str]:
    """Image files under ``folder`` (recursively, sorted); a one-line error if there are none."""
    if not os.path.isdir(folder):
        raise ValueError(f'calibration folder not found: {folder!r} (give a folder of images, '
                         'e.g. data/synthetic/coco/train from tools/make_synthetic_data.py)')
    files = sorted(os.path.join(d, f) for d, _, names in os.walk(folder) for f in names
                   if f.lower().endswith(IMAGE_EXTENSIONS))
    if not files:
        raise ValueError(f'no images ({", ".join(IMAGE_EXTENSIONS)}) under {folder!r}')
    return files[:limit] if limit else files


def calibration_batches(folder: str, data_preprocessor: nn.Module, size: Tuple[int, int],
                        limit: Optional[int] = 32) -> List[np.ndarray]:
    """Up to ``limit`` images of ``folder``, each read as mmcv's ``LoadImageFromFile`` does (BGR),
    resized to ``size`` (H, W) and put through ``data_preprocessor``: [1, 3, H, W] float32."""
    import mmcv
    import torch
    batches = []
    for path in image_files(folder, limit):
        image = mmcv.imread(path, channel_order='bgr')
        if image is None:
            raise ValueError(f'cannot read the image {path!r}')
        image = mmcv.imresize(image, (size[1], size[0]))
        tensor = torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))
        with torch.no_grad():
            batch = data_preprocessor(dict(inputs=[tensor]), False)['inputs']
        batches.append(batch.float().numpy())
    return batches

