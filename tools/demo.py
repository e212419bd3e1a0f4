"""Build the project's Mask R-CNN and UperNet (our Swin-T backbone) and run them on a made image.

    .venv/bin/python tools/demo.py [--det-config ...] [--seg-config ...] [--size H W]

Prints the backbone feature shapes and the detector's and segmentor's output shapes. Weights are
random (nothing can be downloaded here); the shapes and the plumbing are what this shows.
"""
import argparse
import os
import sys
import warnings

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DET = os.path.join(ROOT, 'configs/swin_rpe/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py')
SEG = os.path.join(ROOT, 'configs/swin_rpe/upernet_swin-t-p4-w7_8xb2-160k_ade20k-512x512.py')


def made_image(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A BGR uint8 image with a few filled shapes on a gradient."""
    rng = np.random.default_rng(seed)
    img = np.zeros((h, w, 3), np.uint8)
    img[:] = np.linspace(40, 200, w, dtype=np.uint8)[None, :, None]
    for _ in range(4):
        y0, x0 = rng.integers(0, h // 2), rng.integers(0, w // 2)
        y1, x1 = y0 + rng.integers(h // 8, h // 2), x0 + rng.integers(w // 8, w // 2)
        img[y0:y1, x0:x1] = rng.integers(0, 255, 3)
    return img


def shapes(tensors) -> str:
    return ', '.join(str(tuple(t.shape)) for t in tensors)


def run_detector(config: str, img: np.ndarray) -> None:
    from mmdet.apis import inference_detector, init_detector
    model = init_detector(config, checkpoint=None, device='cpu',
                          cfg_options={'model.backbone.init_cfg': None})
    print(f'[det] {config}\n[det] backbone: {type(model.backbone).__module__}.'
          f'{type(model.backbone).__name__}')
    with torch.no_grad():
        data = model.data_preprocessor({'inputs': [torch.from_numpy(img).permute(2, 0, 1)]})
        print(f'[det] backbone features: {shapes(model.backbone(data["inputs"]))}')
        result = inference_detector(model, img)
    pred = result.pred_instances
    print(f'[det] image {img.shape[:2]} -> boxes {tuple(pred.bboxes.shape)}, scores '
          f'{tuple(pred.scores.shape)}, masks {tuple(pred.masks.shape)}')


def run_segmentor(config: str, img: np.ndarray) -> None:
    from mmengine.model import revert_sync_batchnorm
    from mmseg.apis import inference_model, init_model
    model = init_model(config, checkpoint=None, device='cpu',
                       cfg_options={'model.backbone.init_cfg': None})
    model = revert_sync_batchnorm(model)  # the ADE20K base uses SyncBN: BN on one CPU process
    print(f'[seg] {config}\n[seg] backbone: {type(model.backbone).__module__}.'
          f'{type(model.backbone).__name__}')
    with torch.no_grad():
        data = model.data_preprocessor({'inputs': [torch.from_numpy(img).permute(2, 0, 1)]})
        print(f'[seg] backbone features: {shapes(model.backbone(data["inputs"]))}')
        result = inference_model(model, img)
    print(f'[seg] image {img.shape[:2]} -> logits {tuple(result.seg_logits.data.shape)}, '
          f'label map {tuple(result.pred_sem_seg.data.shape)}')


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--det-config', default=DET)
    parser.add_argument('--seg-config', default=SEG)
    parser.add_argument('--size', type=int, nargs=2, default=(427, 640), metavar=('H', 'W'))
    args = parser.parse_args(argv)
    # The stack's own deprecation chatter (pkg_resources, build_loss) is not ours to show.
    warnings.filterwarnings('ignore', category=DeprecationWarning)
    warnings.filterwarnings('ignore', message='.*(build_loss|avg_non_ignore|checkpoint is None)')
    torch.manual_seed(0)
    img = made_image(*args.size)
    run_detector(args.det_config, img)
    run_segmentor(args.seg_config, img)
    return 0


if __name__ == '__main__':
    sys.exit(main())
