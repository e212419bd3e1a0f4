"""Padding-aware features inside real mmdet and mmseg models, through their preprocessors."""
import os

import pytest
import torch

from swin_rpe_plugin import SwinTransformer, enable_padding_aware

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DET = os.path.join(ROOT, 'configs/swin_rpe/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py')
SEG = os.path.join(ROOT, 'configs/swin_rpe/upernet_swin-t-p4-w7_8xb2-160k_ade20k-512x512.py')
SIZES = [(97, 131), (150, 90)]
SMALL_BACKBONE = {
    'model.backbone.init_cfg': None, 'model.backbone.mask_padding': True,
    'model.backbone.embed_dims': 32, 'model.backbone.num_heads': [1, 2, 4, 8],
    'model.backbone.depths': [2, 2, 2, 2], 'model.backbone.drop_path_rate': 0.0,
}


def build(toolkit):
    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import init_default_scope
    cfg = Config.fromfile(DET if toolkit == 'mmdet' else SEG)
    cfg.merge_from_dict(SMALL_BACKBONE)
    if toolkit == 'mmdet':
        from mmdet.registry import MODELS
        cfg.merge_from_dict({'model.neck.in_channels': [32, 64, 128, 256]})
    else:
        from mmseg.registry import MODELS
        # Pad to a multiple of 32, not to the training crop, so that alone and batched
        # images are padded differently (as in detection and in mmseg's whole inference).
        cfg.merge_from_dict({'model.decode_head.in_channels': [32, 64, 128, 256],
                             'model.auxiliary_head.in_channels': 128,
                             'model.data_preprocessor.size': None,
                             'model.data_preprocessor.size_divisor': 32})
    init_default_scope(toolkit)
    torch.manual_seed(0)
    model = revert_sync_batchnorm(MODELS.build(cfg.model)).eval()
    model.init_weights()
    for name, p in model.backbone.named_parameters():
        if name.endswith('relative_position_bias_table'):
            p.data.normal_()
    return model


def sample(toolkit, h, w):
    if toolkit == 'mmdet':
        from mmdet.structures import DetDataSample as Sample
    else:
        from mmseg.structures import SegDataSample as Sample
    s = Sample()
    s.set_metainfo(dict(img_shape=(h, w), ori_shape=(h, w), scale_factor=(1.0, 1.0)))
    return s


def backbone_and_neck(model, toolkit, images):
    """Backbone outputs and what the next module (neck / decode head) returns."""
    data = {'inputs': images, 'data_samples': [sample(toolkit, *im.shape[1:]) for im in images]}
    # mmseg's test-mode preprocessor refuses images of different sizes: batch them as in training
    data = model.data_preprocessor(data, toolkit == 'mmseg')
    seen = {}
    hooks = [model.backbone.register_forward_hook(lambda m, a, out: seen.update(backbone=out))]
    if toolkit == 'mmdet':
        hooks.append(model.neck.register_forward_hook(lambda m, a, out: seen.update(next=out)))
    with torch.no_grad():
        out = model(**data, mode='tensor')
    for h in hooks:
        h.remove()
    if toolkit == 'mmseg':
        seen['next'] = [out]  # decode-head logits
    return seen['backbone'], seen['next']


def cut(maps, index, hw, stride0):
    out = []
    for i, f in enumerate(maps):
        s = stride0 * 2**i
        out.append(f[index, :, :-(-hw[0] // s), :-(-hw[1] // s)])
    return out


@pytest.mark.parametrize('toolkit', ['mmdet', 'mmseg'])
def test_batched_features_equal_single_image_features(toolkit):
    model = build(toolkit)
    assert type(model.backbone) is SwinTransformer
    torch.manual_seed(1)
    images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8) for h, w in SIZES]
    # Option off: batching changes the smaller image's features.
    alone_off = [backbone_and_neck(model, toolkit, [im])[0] for im in images]
    batched_off = backbone_and_neck(model, toolkit, images)[0]
    enable_padding_aware(model)
    alone = [backbone_and_neck(model, toolkit, [im]) for im in images]
    batched = backbone_and_neck(model, toolkit, images)
    worst_on, worst_off = 0.0, 0.0
    for i, size in enumerate(SIZES):
        for a, b in zip(cut(alone[i][0], 0, size, 4), cut(batched[0], i, size, 4)):
            torch.testing.assert_close(b, a, atol=1e-4, rtol=0)
            worst_on = max(worst_on, (a - b).abs().max().item())
        for a, b in zip(cut(alone_off[i], 0, size, 4), cut(batched_off, i, size, 4)):
            worst_off = max(worst_off, (a - b).abs().max().item())
    assert worst_off > 1e-2 > worst_on  # the option is what makes them equal
    print(f'\n{toolkit} backbone max abs diff batched vs alone: off {worst_off:.3g}, '
          f'on {worst_on:.3g}')


def test_hook_is_registered_and_refuses_other_backbones():
    from mmdet.registry import HOOKS
    import swin_rpe_plugin  # noqa: F401
    hook = HOOKS.build(dict(type='swin_rpe_plugin.PaddingAwareHook'))
    assert type(hook).__name__ == 'PaddingAwareHook'
    with pytest.raises(TypeError, match='swin_rpe_plugin.SwinTransformer'):
        enable_padding_aware(torch.nn.Linear(2, 2))
