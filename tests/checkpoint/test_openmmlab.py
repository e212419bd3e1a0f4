"""mmdet, mmseg and Microsoft-official checkpoints, made here from real models' state dicts.

References are the toolkits' own code: stock mmdet/mmseg SwinTransformer with the same weights,
mmdet's ``swin_converter`` (official -> mmdet names), mmengine's ``load_checkpoint``.
"""
import os

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import load_checkpoint

from swin_rpe_plugin import SwinTransformer
from swin_rpe_plugin.checkpoint import allow_mmengine_checkpoints, load_pretrained

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = dict(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8), window_size=7,
            drop_path_rate=0.0)
TIMM_FIXTURE = os.path.join(ROOT, 'tests', 'fixtures', 'swin', 'timm_tiny.safetensors')
TINY_FIXTURE = dict(TINY, embed_dims=8)  # the configuration of the committed fixtures


def randomized(model):
    torch.manual_seed(3)
    with torch.no_grad():  # stock init leaves tables at 0 and norms at (1, 0): make all matter
        for name, p in model.named_parameters():
            is_norm_weight = p.dim() == 1 and 'norm' in name and name.endswith('weight')
            p.normal_(1.0 if is_norm_weight else 0.0, 0.2 if p.dim() == 1 else 0.3)
    model.eval()  # mmdet's Swin.train() returns None
    return model


def stock(toolkit):
    if toolkit == 'mmdet':
        from mmdet.models.backbones import SwinTransformer as Stock
    else:
        from mmseg.models.backbones import SwinTransformer as Stock
    return randomized(Stock(**TINY))


def assert_same_outputs(ours, reference, hw=(97, 131)):
    x = torch.randn(1, 3, *hw)
    ours.eval()
    reference.eval()
    with torch.no_grad():
        outs, refs = ours(x), reference(x)
    assert len(outs) == len(refs) == 4
    for a, b in zip(outs, refs):
        assert a.shape == b.shape
        assert (a - b).abs().max() < 1e-4


@pytest.mark.parametrize('toolkit', ['mmdet', 'mmseg'])
def test_stock_backbone_checkpoint(tmp_path, toolkit):
    reference = stock(toolkit)
    path = str(tmp_path / 'backbone.pth')
    torch.save({'state_dict': reference.state_dict(), 'meta': {}}, path)
    ours = SwinTransformer(**TINY)
    report = load_pretrained(ours, path)  # strict by default
    assert report.format == 'mmdet' and not report.converted and not report.unexpected
    assert len(report.derived) == 8  # the saved relative_position_index buffers, dropped
    assert sorted(report.loaded) == sorted(ours.state_dict())
    assert_same_outputs(ours, reference)


def whole_detector(backbone: dict):
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=True)
    cfg = Config.fromfile(os.path.join(ROOT, 'configs/swin_rpe/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'))
    cfg.model.backbone = backbone
    cfg.model.neck.in_channels = [16, 32, 64, 128]
    return MODELS.build(cfg.model)


def whole_segmentor(backbone: dict):
    from mmseg.registry import MODELS
    from mmseg.utils import register_all_modules
    register_all_modules(init_default_scope=True)
    cfg = dict(type='EncoderDecoder', backbone=backbone,
               decode_head=dict(type='UPerHead', in_channels=[16, 32, 64, 128],
                                in_index=[0, 1, 2, 3], pool_scales=(1, 2, 3, 6), channels=16,
                                num_classes=5, norm_cfg=dict(type='BN', requires_grad=True)),
               auxiliary_head=dict(type='FCNHead', in_channels=64, in_index=2, channels=8,
                                   num_convs=1, num_classes=5))
    return MODELS.build(cfg)


@pytest.mark.parametrize('build,stock_type', [(whole_detector, 'mmdet.SwinTransformer'),
                                              (whole_segmentor, 'mmseg.SwinTransformer')])
def test_whole_model_checkpoint(tmp_path, build, stock_type):
    """A Mask R-CNN / UperNet with the stock Swin: backbone loads, other keys are counted."""
    model = build(dict(type=stock_type, **TINY))
    randomized(model.backbone)
    path = str(tmp_path / 'whole.pth')
    torch.save({'meta': {'epoch': 12}, 'state_dict': model.state_dict()}, path)
    ours = SwinTransformer(**TINY)
    report = load_pretrained(ours, path)
    outside = [k for k in model.state_dict() if not k.startswith('backbone.')]
    assert sorted(report.ignored) == sorted(outside) and len(outside) > 20
    assert report.container.endswith("prefix 'backbone.'") and not report.missing
    assert_same_outputs(ours, model.backbone)

    # load_from: the same file into the same model with our backbone, through mmengine, strict.
    allow_mmengine_checkpoints()
    ours_whole = build(dict(type='swin_rpe_plugin.SwinTransformer', **TINY))
    load_checkpoint(ours_whole, path, map_location='cpu', strict=True)
    assert_same_outputs(ours_whole.backbone, model.backbone)


def official_from_timm_fixture():
    """The official layout, from the timm fixture (same block names; merging moved to the end
    of the previous stage, as the fixtures' README and its detection-code check do)."""
    from safetensors.torch import load_file

    timm = load_file(TIMM_FIXTURE)
    official = {}
    for key, value in timm.items():
        parts = key.split('.')
        if parts[0] == 'layers' and parts[2] == 'downsample':
            parts[1] = str(int(parts[1]) - 1)
        official['.'.join(parts)] = value
    from swin_rpe_plugin.ops import relative_position_index
    for s in range(4):
        for b in range(2):  # the official code saves its index buffers (we drop them)
            official[f'layers.{s}.blocks.{b}.attn.relative_position_index'] = \
                relative_position_index(7)
    return official


def test_official_checkpoint_matches_mmdet_swin_converter(tmp_path):
    from mmdet.models.backbones import SwinTransformer as Stock
    from mmdet.models.backbones.swin import swin_converter
    official = official_from_timm_fixture()
    path = str(tmp_path / 'official.pth')
    torch.save({'model': official, 'epoch': 300}, path)
    ours = SwinTransformer(**TINY_FIXTURE)
    report = load_pretrained(ours, path)
    assert report.format == 'official' and len(report.derived) == 8
    assert len(report.not_in_format) == 8 and not report.missing and not report.unexpected
    # mmdet's own converter, loaded into mmdet's own Swin, is the reference.
    reference = Stock(**TINY_FIXTURE)
    converted = {k[len('backbone.'):]: v for k, v in swin_converter(official).items()}
    missing, unexpected = reference.load_state_dict(converted, strict=False)
    assert all(k.startswith('norm') for k in missing)
    with torch.no_grad():
        for i in range(4):
            getattr(ours, f'norm{i}').load_state_dict(getattr(reference, f'norm{i}').state_dict())
    assert_same_outputs(ours, reference, hw=(224, 224))
    assert_same_outputs(ours, reference, hw=(97, 131))
