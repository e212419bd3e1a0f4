"""The SwinV2 configs build through mmdet's and mmseg's own registries and run on CPU."""
import os

import numpy as np
import pytest
import torch
from mmengine.config import Config

from swin_rpe_plugin import SwinTransformerV2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DET = ['configs/swin_rpe/mask-rcnn_swinv2-t-p4-w16-pre-w8_fpn_1x_coco.py',
       'configs/swin_rpe/mask-rcnn_swinv2-t-p4-w16-pre-w8_fpn_ms-crop-3x_coco.py']
SEG = 'configs/swin_rpe/upernet_swinv2-t-p4-w16-pre-w8_8xb2-160k_ade20k-512x512.py'
SYNTHETIC = ['configs/synthetic/mask-rcnn_swinv2-tiny_fpn_shapes.py',
             'configs/synthetic/upernet_swinv2-tiny_shapes-128x128.py']
NO_WEIGHTS = {'model.backbone.init_cfg': None}


def image(h, w):
    return np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8)


def check_backbone(model, img, embed_dims=96, window=(16, 16), pretrained=(8, 8)):
    backbone = model.backbone
    assert type(backbone) is SwinTransformerV2
    assert backbone.window_size == window and backbone.pretrained_window_sizes == (pretrained,) * 4
    with torch.no_grad():
        data = model.data_preprocessor({'inputs': [torch.from_numpy(img).permute(2, 0, 1)]})
        feats = backbone(data['inputs'])
    h, w = data['inputs'].shape[-2:]
    h, w = -(-h // 4), -(-w // 4)
    for i, f in enumerate(feats):
        assert f.shape == (1, embed_dims * 2**i, h, w)
        h, w = -(-h // 2), -(-w // 2)


def test_registries_build_swinv2_by_scoped_type():
    import swin_rpe_plugin  # noqa: F401  (what custom_imports does)
    from mmdet.registry import MODELS as DET_MODELS
    from mmseg.registry import MODELS as SEG_MODELS
    cfg = dict(type='swin_rpe_plugin.SwinTransformerV2', embed_dims=32, num_heads=(1, 2, 4, 8),
               window_size=12, pretrained_window_size=8)
    for registry in (DET_MODELS, SEG_MODELS):
        model = registry.build(cfg)
        assert type(model) is SwinTransformerV2 and model.pretrained_window_sizes[0] == (8, 8)


@pytest.mark.parametrize('config', DET)
def test_mask_rcnn_swinv2_configs_build_and_run(config):
    from mmdet.apis import inference_detector, init_detector
    model = init_detector(os.path.join(ROOT, config), checkpoint=None, device='cpu',
                          cfg_options=NO_WEIGHTS)
    img = image(150, 230)
    check_backbone(model, img)
    pred = inference_detector(model, img).pred_instances
    n = len(pred.scores)
    assert pred.bboxes.shape == (n, 4) and pred.masks.shape == (n, 150, 230)
    cfg = Config.fromfile(os.path.join(ROOT, config))
    assert cfg.model.backbone.init_cfg.checkpoint.endswith('swinv2_tiny_patch4_window8_256.pth')
    keys = cfg.optim_wrapper.paramwise_cfg.custom_keys
    names = [n for n, _ in model.backbone.named_parameters()]
    for key in ('cpb_mlp', 'logit_scale'):  # the no-decay rules key on our parameter names
        assert keys[key]['decay_mult'] == 0 and any(key in n for n in names)


def test_upernet_swinv2_config_builds_and_runs():
    from mmengine.model import revert_sync_batchnorm
    from mmseg.apis import inference_model, init_model
    model = revert_sync_batchnorm(init_model(os.path.join(ROOT, SEG), checkpoint=None,
                                             device='cpu', cfg_options=NO_WEIGHTS))
    img = image(131, 97)
    check_backbone(model, img)
    result = inference_model(model, img)
    assert result.seg_logits.data.shape == (150, 131, 97)


@pytest.mark.parametrize('config', SYNTHETIC)
def test_synthetic_swinv2_configs_build_their_tiny_backbone(config):
    cfg = Config.fromfile(os.path.join(ROOT, config))
    assert cfg.model.backbone.type == 'swin_rpe_plugin.SwinTransformerV2'
    import swin_rpe_plugin  # noqa: F401
    from swin_rpe_plugin.registry import MODELS
    backbone = MODELS.build(cfg.model.backbone)
    assert backbone.window_size == (4, 4) and backbone.out_channels == [32, 64, 128, 256]
    with torch.no_grad():
        outs = backbone(torch.randn(1, 3, 128, 128))
    assert [tuple(o.shape[-2:]) for o in outs] == [(32, 32), (16, 16), (8, 8), (4, 4)]
