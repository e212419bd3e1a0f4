"""Pictures of predictions for ``tools/test.py --show-dir``, for mmdet and mmseg alike.

The drawing is the toolkit's own visualizer (``DetLocalVisualizer``/``SegLocalVisualizer``:
ground truth left, prediction right). The stock hooks are not used because they differ in ways
that lose pictures: mmseg 1.2's ``SegVisualizationHook`` reads ``runner.iter`` for the file
name, which builds the training loop and so needs the training data, and draws only every 50th
image in validation; mmdet's ignores its interval in testing. This hook draws every
``interval``-th test image and names the file after the image.
"""
import os
import os.path as osp

import mmcv
from mmengine import fileio
from mmengine.hooks import Hook


class PredictionPicturesHook(Hook):
    """After each test iteration, save ground truth | prediction of every interval-th image."""

    priority = 'LOW'

    def __init__(self, out_dir: str, interval: int = 1):
        if interval < 1:
            raise ValueError(f'interval must be >= 1, got {interval}')
        self.out_dir = osp.abspath(out_dir)
        self.interval = interval
        self.seen = 0
        self.written = []

    def before_test(self, runner) -> None:
        os.makedirs(self.out_dir, exist_ok=True)

    def after_test_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        for sample in outputs or []:
            self.seen += 1
            if (self.seen - 1) % self.interval:
                continue
            image = mmcv.imfrombytes(fileio.get(sample.img_path), channel_order='rgb')
            name = osp.splitext(osp.basename(sample.img_path))[0]
            out_file = osp.join(self.out_dir, f'{name}.png')
            runner.visualizer.add_datasample(name, image, data_sample=sample, draw_gt=True,
                                             draw_pred=True, show=False, out_file=out_file,
                                             step=self.seen)
            self.written.append(out_file)
