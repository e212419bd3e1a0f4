"""mmseg's ``SegDataPreProcessor`` that also batches test images of different sizes.

mmseg's test mode refuses a batch whose images differ in size ("The image size in a batch should
be the same"), so a test batch size above 1 needs images of one size. This drop-in pads them as
its training mode does (to ``test_cfg``'s ``size`` / ``size_divisor``, a multiple of 32 when
neither is set), bottom-right, and records each image's padding in its sample, which mmseg's
post-processing crops away. Batches of one size go through mmseg's own path unchanged.
``tools/test.py --batch-size N`` selects it for mmseg configs; the config imports
``swin_rpe_plugin.models.seg_preprocessor``.
"""
from __future__ import annotations

from typing import Any, Dict

from mmseg.models.data_preprocessor import SegDataPreProcessor
from mmseg.utils import stack_batch

from ..registry import MODELS


@MODELS.register_module()
class BatchingSegDataPreprocessor(SegDataPreProcessor):
    """``SegDataPreProcessor`` whose test mode pads images of different sizes into a batch."""

    def forward(self, data: dict, training: bool = False) -> Dict[str, Any]:
        inputs = data['inputs']
        if training or len({tuple(x.shape[1:]) for x in inputs}) == 1:
            return super().forward(data, training)
        data = self.cast_data(data)
        inputs, data_samples = data['inputs'], data.get('data_samples', None)
        if self.channel_conversion and inputs[0].size(0) == 3:
            inputs = [x[[2, 1, 0], ...] for x in inputs]
        inputs = [x.float() for x in inputs]
        if self._enable_normalize:
            inputs = [(x - self.mean) / self.std for x in inputs]
        test_cfg = self.test_cfg or {}
        size, divisor = test_cfg.get('size', None), test_cfg.get('size_divisor', None)
        inputs, padded = stack_batch(inputs=inputs, size=size,
                                     size_divisor=divisor if size or divisor else 32,
                                     pad_val=self.pad_val, seg_pad_val=self.seg_pad_val)
        for sample, pad_info in zip(data_samples, padded):
            sample.set_metainfo({**pad_info})
        return dict(inputs=inputs, data_samples=data_samples)
