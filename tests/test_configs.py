"""The project's configs build through the toolkits' own registries and run on CPU."""
import os

import numpy as np
import pytest
import torch

from swin_rpe_plugin import SwinTransformer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DET = os.path.join(ROOT, 'configs/swin_rpe/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py')
SEG = os.path.join(ROOT, 'configs/swin_rpe/upernet_swin-t-p4-w7_8xb2-160k_ade20k-512x512.py')
NO_WEIGHTS = {'model.backbone.init_cfg': None}


def image(h, w):
    return np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8)


def check_backbone(model, img):
    assert type(model.backbone) is SwinTransformer
    with torch.no_grad():
        data = model.data_preprocessor({'inputs': [torch.from_numpy(img).permute(2, 0, 1)]})
        feats = model.backbone(data['inputs'])
    h, w = data['inputs'].shape[-2:]
    h, w = -(-h // 4), -(-w // 4)
    for i, f in enumerate(feats):
        assert f.shape == (1, 96 * 2**i, h, w)
        h, w = -(-h // 2), -(-w // 2)


def test_registries_build_our_backbone_by_scoped_type():
    import swin_rpe_plugin  # noqa: F401  (what custom_imports does)
    from mmdet.registry import MODELS as DET_MODELS
    from mmseg.registry import MODELS as SEG_MODELS
    cfg = dict(type='swin_rpe_plugin.SwinTransformer', embed_dims=32, num_heads=(1, 2, 4, 8))
    for registry in (DET_MODELS, SEG_MODELS):
        assert type(registry.build(cfg)) is SwinTransformer


def test_mask_rcnn_config_builds_and_runs():
    from mmdet.apis import inference_detector, init_detector
    model = init_detector(DET, checkpoint=None, device='cpu', cfg_options=NO_WEIGHTS)
    img = image(150, 230)
    check_backbone(model, img)
    result = inference_detector(model, img)
    pred = result.pred_instances
    n = len(pred.scores)
    assert pred.bboxes.shape == (n, 4) and pred.masks.shape == (n, 150, 230)
    # Optimiser rules of the config key on our parameter names.
    names = [n for n, _ in model.backbone.named_parameters()]
    assert any('relative_position_bias_table' in n for n in names)


def test_upernet_config_builds_and_runs():
    from mmengine.model import revert_sync_batchnorm
    from mmseg.apis import inference_model, init_model
    model = revert_sync_batchnorm(
        init_model(SEG, checkpoint=None, device='cpu', cfg_options=NO_WEIGHTS))
    assert not any(isinstance(m, torch.nn.SyncBatchNorm) for m in model.modules())
    img = image(131, 97)
    check_backbone(model, img)
    result = inference_model(model, img)
    assert result.seg_logits.data.shape == (150, 131, 97)
    assert result.pred_sem_seg.data.shape == (1, 131, 97)
