"""Deterministic synthetic shape datasets in COCO (instances) and ADE20K (semantic) layout.

Every image is drawn from its own generator seeded by (seed, split, index), so a set is the same
on every machine and a single image can be regenerated alone. Shapes are filled polygons of a
handful of classes on a flat, noisy background; they never overlap, so each instance polygon is
its exact visible outline.

Sizes: every image is ``size`` (H, W), or, with ``size_range=(lo, hi)``, its own H and W drawn
uniformly from lo..hi (from the image's generator, so still reproducible): varied sizes and
aspect ratios, so that batching pads (``tools/test.py --batch-size N``).

COCO layout (``<root>/coco``): ``{train,val}/*.jpg`` and ``annotations/instances_{train,val}.json``
with polygons, [x, y, w, h] boxes, polygon areas (pycocotools) and ``iscrowd=0``.

ADE20K layout (``<root>/ade``): ``images/{training,validation}/*.jpg`` and
``annotations/{training,validation}/*.png`` label maps with the ADE20K convention: 0 is
"unlabelled" (here a one-pixel ring on each shape's border), 1 is the background class and
2.. are the shapes, so ``reduce_zero_label=True`` maps 0 -> 255 (ignored) and k -> k - 1.
"""
import json
import os
from typing import Dict, List, Optional, Sequence, Tuple

import cv2
import numpy as np
from tqdm import tqdm

SHAPES: Tuple[str, ...] = ('circle', 'square', 'triangle', 'star')
SEG_CLASSES: Tuple[str, ...] = ('background',) + SHAPES
SEG_PALETTE: List[List[int]] = [[0, 0, 0], [220, 20, 60], [0, 128, 255], [60, 180, 75],
                                [255, 200, 0]]
# BGR base colour of each shape class in the semantic set (``class_colors=True``).
CLASS_COLORS = np.array([[60, 20, 220], [255, 128, 0], [75, 180, 60], [0, 200, 255]])
SPLITS = {'train': 0, 'val': 1}
ADE_SPLITS = {'train': 'training', 'val': 'validation'}


def shape_polygon(kind: str, center: Tuple[float, float], radius: float,
                  angle: float) -> np.ndarray:
    """Vertices [N, 2] (x, y) of a shape of circumradius ``radius`` rotated by ``angle``."""
    if kind == 'circle':
        t = np.linspace(0, 2 * np.pi, 32, endpoint=False)
        r = np.full_like(t, radius)
    elif kind in ('square', 'triangle'):
        n = 4 if kind == 'square' else 3
        t = np.linspace(0, 2 * np.pi, n, endpoint=False)
        r = np.full_like(t, radius)
    elif kind == 'star':
        t = np.linspace(0, 2 * np.pi, 10, endpoint=False)
        r = np.where(np.arange(10) % 2 == 0, radius, 0.45 * radius)
    else:
        raise ValueError(f'unknown shape kind {kind!r}; expected one of {SHAPES}')
    t = t + angle
    return np.stack([center[0] + r * np.cos(t), center[1] + r * np.sin(t)], axis=1)


def draw_sample(rng: np.random.Generator, size: Tuple[int, int], max_shapes: int = 4,
                class_colors: bool = False, radius: Tuple[float, float] = (0.09, 0.22)) -> Tuple[np.ndarray, List[Tuple[int, np.ndarray]]]:
    """One BGR image [H, W, 3] uint8 and its shapes as (class index, polygon [N, 2]).

    ``class_colors``: each class is drawn in its own colour (``CLASS_COLORS`` +- 30), on a
    background at least 100 away from all of them, so colour as well as shape tells classes
    apart; otherwise colours are random and only the shape does.
    """
    h, w = size
    background = rng.integers(0, 256, 3)
    while class_colors and np.abs(CLASS_COLORS - background).sum(1).min() < 100:
        background = rng.integers(0, 256, 3)
    img = np.empty((h, w, 3), np.float32)
    img[:] = background
    img += rng.normal(0, 6, (h, w, 3))
    shapes: List[Tuple[int, np.ndarray]] = []
    placed: List[Tuple[float, float, float]] = []
    lo, hi = radius[0] * min(h, w), radius[1] * min(h, w)
    for _ in range(int(rng.integers(1, max_shapes + 1))):
        for _attempt in range(20):  # rejection sampling keeps shapes apart (no occlusion)
            r = rng.uniform(lo, hi)
            cx, cy = rng.uniform(r + 1, w - r - 1), rng.uniform(r + 1, h - r - 1)
            if all((cx - x) ** 2 + (cy - y) ** 2 > (r + q + 3) ** 2 for x, y, q in placed):
                break
        else:
            continue
        label = int(rng.integers(len(SHAPES)))
        if class_colors:
            color = np.clip(CLASS_COLORS[label] + rng.integers(-30, 31, 3), 0, 255)
        else:
            color = (background + rng.integers(70, 186, 3)) % 256  # far from the background
        poly = shape_polygon(SHAPES[label], (cx, cy), r, rng.uniform(0, 2 * np.pi))
        cv2.fillPoly(img, [np.round(poly * 16).astype(np.int32)], color.tolist(),
                     lineType=cv2.LINE_AA, shift=4)
        placed.append((cx, cy, r))
        shapes.append((label, poly))
    return np.clip(img, 0, 255).astype(np.uint8), shapes


def _rng(seed: int, split: str, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, SPLITS[split], index])


def image_size(rng: np.random.Generator, size: Tuple[int, int],
               size_range: Optional[Tuple[int, int]]) -> Tuple[int, int]:
    """``size``, or (H, W) drawn from ``size_range`` (inclusive) with the image's generator."""
    if size_range is None:
        return tuple(size)
    lo, hi = size_range
    return int(rng.integers(lo, hi + 1)), int(rng.integers(lo, hi + 1))


def check_sizes(size: Tuple[int, int], size_range: Optional[Tuple[int, int]]) -> None:
    if len(size) != 2 or min(size) < 16:
        raise ValueError(f'size must be (H, W) with both >= 16, got {tuple(size)}')
    if size_range is not None and (len(size_range) != 2 or not
                                   16 <= size_range[0] <= size_range[1]):
        raise ValueError(f'size_range must be (min, max) with 16 <= min <= max, got '
                         f'{tuple(size_range)}')


def _polygon_area(poly: np.ndarray, size: Tuple[int, int]) -> float:
    from pycocotools import mask as mask_utils
    rle = mask_utils.frPyObjects([poly.reshape(-1).tolist()], *size)
    return float(mask_utils.area(mask_utils.merge(rle)))


def write_coco(root: str, num_images: Dict[str, int], seed: int = 0,
               size: Tuple[int, int] = (128, 128), progress: bool = True,
               size_range: Optional[Tuple[int, int]] = None) -> Dict[str, str]:
    """Write the COCO-format instance set under ``root``; return {split: annotation file}."""
    os.makedirs(os.path.join(root, 'annotations'), exist_ok=True)
    categories = [dict(id=i + 1, name=name, supercategory='shape')
                  for i, name in enumerate(SHAPES)]
    files = {}
    for split, count in num_images.items():
        os.makedirs(os.path.join(root, split), exist_ok=True)
        images, annotations = [], []
        for index in tqdm(range(count), desc=f'coco {split}', disable=not progress):
            rng = _rng(seed, split, index)
            hw = image_size(rng, size, size_range)
            img, shapes = draw_sample(rng, hw)
            name = f'{index:06d}.jpg'
            cv2.imwrite(os.path.join(root, split, name), img, [cv2.IMWRITE_JPEG_QUALITY, 95])
            images.append(dict(id=index, file_name=name, height=hw[0], width=hw[1]))
            for label, poly in shapes:
                x0, y0 = poly.min(0)
                x1, y1 = poly.max(0)
                annotations.append(dict(
                    id=len(annotations) + 1, image_id=index, category_id=label + 1,
                    segmentation=[np.round(poly, 2).reshape(-1).tolist()],
                    bbox=[round(float(v), 2) for v in (x0, y0, x1 - x0, y1 - y0)],
                    area=_polygon_area(poly, hw), iscrowd=0))
        files[split] = os.path.join(root, 'annotations', f'instances_{split}.json')
        with open(files[split], 'w') as f:
            json.dump(dict(images=images, annotations=annotations, categories=categories), f)
    return files


def label_map(shapes: Sequence[Tuple[int, np.ndarray]], size: Tuple[int, int]) -> np.ndarray:
    """ADE20K-convention label map [H, W] uint8: 0 border ring, 1 background, 2.. shapes."""
    seg = np.ones(size, np.uint8)
    for label, poly in shapes:
        pts = [np.round(poly * 16).astype(np.int32)]
        cv2.fillPoly(seg, pts, label + 2, lineType=cv2.LINE_8, shift=4)
        # Anti-aliased edges are neither class: leave them unlabelled, as ADE20K does.
        cv2.polylines(seg, pts, True, 0, thickness=1, lineType=cv2.LINE_8, shift=4)
    return seg


def write_ade(root: str, num_images: Dict[str, int], seed: int = 0,
              size: Tuple[int, int] = (128, 128), progress: bool = True,
              size_range: Optional[Tuple[int, int]] = None) -> None:
    """Write the ADE20K-format semantic set under ``root``."""
    for split, count in num_images.items():
        img_dir = os.path.join(root, 'images', ADE_SPLITS[split])
        ann_dir = os.path.join(root, 'annotations', ADE_SPLITS[split])
        os.makedirs(img_dir, exist_ok=True)
        os.makedirs(ann_dir, exist_ok=True)
        for index in tqdm(range(count), desc=f'ade {split}', disable=not progress):
            # Another stream than the COCO set (seed + 1): the two sets are independent. Shapes
            # are colour-coded by class: learning shape identity per pixel from scratch takes
            # longer than the demo's CPU minutes (the COCO set keeps random colours).
            rng = _rng(seed + 1, split, index)
            hw = image_size(rng, size, size_range)
            img, shapes = draw_sample(rng, hw, max_shapes=6, class_colors=True,
                                      radius=(0.1, 0.28))
            cv2.imwrite(os.path.join(img_dir, f'{index:06d}.jpg'), img,
                        [cv2.IMWRITE_JPEG_QUALITY, 95])
            cv2.imwrite(os.path.join(ann_dir, f'{index:06d}.png'), label_map(shapes, hw))


def make_synthetic_data(out_dir: str, num_train: int = 200, num_val: int = 50, seed: int = 0,
                        size: Tuple[int, int] = (128, 128), progress: bool = True,
                        size_range: Optional[Tuple[int, int]] = None) -> dict:
    """Write both sets under ``out_dir`` (``coco/`` and ``ade/``); return their roots.

    ``size_range=(lo, hi)``: each image's H and W drawn from lo..hi instead of ``size``.
    """
    if num_train < 1 or num_val < 1:
        raise ValueError(f'num_train and num_val must be >= 1, got {num_train}, {num_val}')
    check_sizes(size, size_range)
    counts = {'train': num_train, 'val': num_val}
    coco, ade = os.path.join(out_dir, 'coco'), os.path.join(out_dir, 'ade')
    write_coco(coco, counts, seed, size, progress, size_range)
    write_ade(ade, counts, seed, size, progress, size_range)
    return dict(coco=coco, ade=ade)
