"""With padding-aware on, whole models give an image the same outputs alone and batched.

Reference: the image run alone (batch 1) through the same model; the same image batched with
bigger and differently shaped ones. Tiny Swin models of configs/synthetic with random weights
(seeded), images of the synthetic shapes at odd sizes, the toolkits' own data preprocessors.
"""
import os

import numpy as np
import pytest
import torch

from swin_rpe_plugin import enable_padding_aware
from swin_rpe_plugin.datasets.synthetic import draw_sample

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = {
    'mask-rcnn': 'configs/synthetic/mask-rcnn_swin-rpe-tiny_fpn_shapes.py',
    'cascade-mask-rcnn': 'configs/synthetic/mask-rcnn_swin-rpe-tiny_fpn_shapes.py',
    'retinanet': 'configs/synthetic/retinanet_swin-rpe-tiny_fpn_shapes.py',
    'upernet': 'configs/synthetic/upernet_swin-rpe-tiny_shapes-128x128.py',
}
# The first image is the one compared; the others pad it differently in the batch.
SIZES = [(57, 77), (90, 54), (37, 121)]
# The targets.
SCORE_THR, BOX_TOL, SCORE_TOL, LOGIT_TOL = 0.05, 0.01, 1e-4, 1e-4
# Random weights of unit gain (std 1/sqrt(fan_in)): scores spread away from the heads' init
# priors, and float noise is not amplified layer after layer as a trained model would not.
WEIGHT_GAIN = 1.0
# Added to the background logit of the RoI heads' classifiers: random weights otherwise pass
# thousands of detections above SCORE_THR (2,761 for the cascade's image alone) and their masks
# took most of the test's time; with these, a few hundred are compared.
BACKGROUND_BIAS = {'mask-rcnn': 2.5, 'cascade-mask-rcnn': 3.25}
# Masks: the thresholded masks are identical on every pixel whose probability alone (mmdet's
# soft mask, probability * 255 floored) is not within 0.01 of the 0.5 threshold. Bitwise-equal
# probabilities are out of reach: oneDNN's 1x1 convs and GEMMs sum in an order that depends on
# the problem size (the same 16x20 region inside a 16x20 and a 20x28 map differs by 1e-6),
# the RoI heads run on all the batch's RoIs at once, and the boxes the masks are pasted into
# differ by ~1e-4 px (well within BOX_TOL), so a pixel that close to the threshold can flip.
NEAR_THRESHOLD = (125, 129)  # soft values 125..129: probability in [0.490, 0.510)


def cascade_model(cfg):
    """mmdet's Cascade Mask R-CNN with the tiny Swin of the synthetic Mask R-CNN."""
    import mmdet
    from mmengine.config import Config
    base = os.path.join(os.path.dirname(mmdet.__file__),
                        '.mim/configs/_base_/models/cascade-mask-rcnn_r50_fpn.py')
    cascade = Config.fromfile(base).model
    cascade.backbone = cfg.model.backbone
    cascade.neck.in_channels = cfg.model.neck.in_channels
    cascade.rpn_head.anchor_generator.scales = [4]
    # the synthetic Mask R-CNN's widths (64 channels), so that the test stays small
    cascade.neck.out_channels = 64
    cascade.rpn_head.update(in_channels=64, feat_channels=64)
    roi = cascade.roi_head
    roi.bbox_roi_extractor.out_channels = roi.mask_roi_extractor.out_channels = 64
    for head in roi.bbox_head:
        head.update(num_classes=4, in_channels=64, fc_out_channels=256)
    roi.mask_head.update(num_classes=4, in_channels=64, conv_out_channels=64, num_convs=2)
    return cascade


def build(name):
    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import init_default_scope
    cfg = Config.fromfile(os.path.join(ROOT, CONFIGS[name]))
    cfg.model.backbone.update(mask_padding=True, drop_path_rate=0.0)
    toolkit = 'mmseg' if name == 'upernet' else 'mmdet'
    if name == 'cascade-mask-rcnn':
        cfg.model = cascade_model(cfg)
    if toolkit == 'mmdet':
        from mmdet.registry import MODELS
        import swin_rpe_plugin.datasets.coco_shapes  # noqa: F401
        test_cfg = cfg.model.test_cfg
        if 'rpn' in test_cfg:  # no top-k cut of proposals: near-equal random scores tie there
            test_cfg.rpn.update(nms_pre=100000, max_per_img=100000)
            test_cfg.rcnn.update(score_thr=SCORE_THR, max_per_img=100000)
        else:
            test_cfg.update(nms_pre=100000, score_thr=SCORE_THR, max_per_img=100000)
    else:
        from mmseg.registry import MODELS
        # mmseg's test-mode preprocessor refuses images of different sizes: batch them as in
        # training, padded to a multiple of 32 (alone and batched images then pad differently)
        cfg.model.data_preprocessor.update(size=None, size_divisor=32)
    init_default_scope(toolkit)
    torch.manual_seed(0)
    model = revert_sync_batchnorm(MODELS.build(cfg.model)).eval()
    model.init_weights()
    with torch.no_grad():  # random weights with spread: scores far from their init prior
        for module in model.modules():
            if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
                fan_in = module.weight[0].numel()
                module.weight.normal_(0, WEIGHT_GAIN / fan_in ** 0.5)
                if module.bias is not None:
                    module.bias.normal_(0, 0.1)
            elif isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.normal_(0, 0.1)
                module.running_var.uniform_(0.5, 1.5)
        if name in BACKGROUND_BIAS:  # mmdet's background class is the last
            heads = model.roi_head.bbox_head
            for head in heads if isinstance(heads, torch.nn.ModuleList) else [heads]:
                head.fc_cls.bias[-1] += BACKGROUND_BIAS[name]
    return model, toolkit


def images():
    rng = np.random.default_rng(0)
    return [torch.from_numpy(draw_sample(rng, size)[0]).permute(2, 0, 1).contiguous()
            for size in SIZES]


def predict(model, toolkit, imgs):
    if toolkit == 'mmdet':
        from mmdet.structures import DetDataSample as Sample
    else:
        from mmseg.structures import SegDataSample as Sample
    samples = []
    for im in imgs:
        s = Sample()
        h, w = im.shape[1:]
        s.set_metainfo(dict(img_shape=(h, w), ori_shape=(h, w), scale_factor=(1.0, 1.0)))
        samples.append(s)
    data = model.data_preprocessor({'inputs': imgs, 'data_samples': samples},
                                   toolkit == 'mmseg')
    with torch.no_grad():
        return model(**data, mode='predict')


def match_detections(alone, batched):
    """Pairs (i, j) of the detections above SCORE_THR, matched one to one; raises on a miss."""
    a, b = alone.pred_instances, batched.pred_instances
    ia = torch.nonzero(a.scores > SCORE_THR).flatten()
    ib = torch.nonzero(b.scores > SCORE_THR).flatten()
    close = (a.labels[ia, None] == b.labels[None, ib]) & \
        ((a.bboxes[ia, None] - b.bboxes[None, ib]).abs().amax(-1) <= BOX_TOL) & \
        ((a.scores[ia, None] - b.scores[None, ib]).abs() <= SCORE_TOL)
    pairs, free = [], torch.ones(len(ib), dtype=torch.bool)
    for row, i in enumerate(ia.tolist()):
        options = torch.nonzero(close[row] & free).flatten()
        assert len(options), (f'detection {i} (label {int(a.labels[i])}, score '
                              f'{float(a.scores[i]):.5f}, box {a.bboxes[i].tolist()}) alone has '
                              'no match batched')
        free[options[0]] = False
        pairs.append((i, int(ib[options[0]])))
    assert not free.any(), f'{int(free.sum())} detections batched have no match alone'
    return pairs


def worst_detection_diff(alone, batched):
    """Max box and score difference over matched detections, inf when they do not match."""
    try:
        pairs = match_detections(alone, batched)
    except AssertionError:
        return float('inf'), float('inf')
    a, b = alone.pred_instances, batched.pred_instances
    box = max([(a.bboxes[i] - b.bboxes[j]).abs().max().item() for i, j in pairs] + [0.0])
    score = max([(a.scores[i] - b.scores[j]).abs().item() for i, j in pairs] + [0.0])
    return box, score


@pytest.mark.parametrize('name', ['mask-rcnn', 'cascade-mask-rcnn', 'retinanet'])
def test_detections_alone_equal_batched(name):
    model, toolkit = build(name)
    imgs = images()
    off_alone, off_batched = predict(model, toolkit, imgs[:1])[0], predict(model, toolkit, imgs)[0]
    enable_padding_aware(model)
    alone, batched = predict(model, toolkit, imgs[:1])[0], predict(model, toolkit, imgs)[0]
    pairs = match_detections(alone, batched)
    assert len(pairs) >= 5  # the comparison has detections to compare
    a, b = alone.pred_instances, batched.pred_instances
    if 'masks' in a:
        model.roi_head.test_cfg.mask_thr_binary = -1  # soft masks, uint8 probability * 255
        soft_a = predict(model, toolkit, imgs[:1])[0].pred_instances.masks
        soft_b = predict(model, toolkit, imgs)[0].pred_instances.masks
        model.roi_head.test_cfg.mask_thr_binary = 0.5
        flipped = 0
        for i, j in pairs:
            sure = (soft_a[i] < NEAR_THRESHOLD[0]) | (soft_a[i] > NEAR_THRESHOLD[1])
            assert torch.equal(b.masks[j][sure], a.masks[i][sure]), \
                f'mask of detection {i} differs away from the threshold'
            flipped += int((a.masks[i] != b.masks[j]).sum())
        total = sum(int(a.masks[i].sum()) for i, _ in pairs)
        print(f'\n{name}: {flipped} of {total} mask pixels flipped (all within 0.01 of 0.5)')
    # Option off, the same comparison fails: padding is what the option keeps out.
    box_off, score_off = worst_detection_diff(off_alone, off_batched)
    assert box_off > BOX_TOL or score_off > SCORE_TOL
    box_on, score_on = worst_detection_diff(alone, batched)
    print(f'\n{name}: {len(pairs)} detections above {SCORE_THR}; worst box / score diff '
          f'on {box_on:.3g} / {score_on:.3g}, off {box_off:.3g} / {score_off:.3g}')


def test_upernet_logits_alone_equal_batched():
    model, toolkit = build('upernet')
    imgs = images()
    h, w = SIZES[0]
    off = [predict(model, toolkit, imgs[:n])[0].seg_logits.data for n in (1, 3)]
    enable_padding_aware(model)
    alone, batched = [predict(model, toolkit, imgs[:n])[0].seg_logits.data for n in (1, 3)]
    assert alone.shape == batched.shape == (5, h, w)
    torch.testing.assert_close(batched, alone, atol=LOGIT_TOL, rtol=0)
    worst_off = (off[0] - off[1]).abs().max().item()
    assert worst_off > LOGIT_TOL
    print(f'\nupernet: worst logit diff on {(alone - batched).abs().max().item():.3g}, '
          f'off {worst_off:.3g}')


def test_neck_and_rpn_outputs_are_those_of_the_image_alone_bit_for_bit():
    """Given the same backbone features on the image (zeros beyond it), the FPN and RPN outputs
    on its region are bitwise those of the image alone: each conv runs on the image's own crop,
    so the sums have the same shapes alone and batched (oneDNN's order depends on both)."""
    from swin_rpe_plugin.models.padding import padding_state, valid_sizes_at
    model, _ = build('mask-rcnn')
    enable_padding_aware(model)
    state = padding_state(model)
    torch.manual_seed(1)
    strides = [4 * 2**i for i in range(len(model.neck.in_channels))]
    regions = [[torch.randn(c, -(-h // s), -(-w // s)) for c, s in
                zip(model.neck.in_channels, strides)] for h, w in SIZES]

    def neck_and_rpn(count, input_hw):
        feats = [torch.zeros(count, c, -(-input_hw[0] // s), -(-input_hw[1] // s))
                 for c, s in zip(model.neck.in_channels, strides)]
        for b in range(count):
            for level, region in enumerate(regions[b]):
                feats[level][b, :, :region.shape[1], :region.shape[2]] = region
        state.sizes, state.input_hw = list(SIZES[:count]), input_hw
        try:
            with torch.no_grad():
                neck = model.neck(feats)
                scores, deltas = model.rpn_head(neck)
        finally:
            state.reset()
        return list(neck) + list(scores) + list(deltas), input_hw

    runs = [neck_and_rpn(1, (64, 96)), neck_and_rpn(3, (96, 128))]
    for alone, batched in zip(runs[0][0], runs[1][0]):
        (h, w), = valid_sizes_at(SIZES[:1], alone.shape[-2:], runs[0][1])
        assert (h, w) == valid_sizes_at(SIZES[:1], batched.shape[-2:], runs[1][1])[0]
        assert torch.equal(batched[0, :, :h, :w], alone[0, :, :h, :w])
