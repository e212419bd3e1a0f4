"""Whole-model comparison: the stock Mask R-CNN / UperNet Swin-T with our backbone swapped in.

Both models come from the toolkits' own configs (``mmdet::swin/...`` and ``mmseg::swin/...``);
ours differs only in ``backbone.type = 'swin_rpe_plugin.SwinTransformer'``, with the backbone's
``init_cfg`` / ``pretrained`` removed (nothing is downloaded) and the stock model's state dict
copied in, so both run the same weights. A step is what a user feels:

- predict: ``model(inputs, data_samples, mode='predict')`` under no_grad, the whole post-processing
  (NMS, mask paste / resize) included;
- train: ``mode='loss'``, the losses summed by ``parse_losses`` and back-propagated (no optimizer
  step: both sides would pay for the same one).

bf16 runs backbone and neck under autocast and the heads in float32, as ``tools/train.py --amp``
does on CPU (``AutocastOptimWrapper(autocast_modules=['backbone', 'neck'])``): mmcv 2.1's CPU
nms and RoIAlign have no bf16 kernels. The input is one synthetic image (random pixels) with a
few rectangular boxes and masks, or a seg map of random rectangles.
"""
import atexit
import os
import shutil
import tempfile
from typing import Dict, Tuple

import torch

import swin_rpe_plugin  # noqa: F401  registers our backbone in its scope
from .runner import ChildStep, Comparison

__all__ = ['DETECTOR_CONFIGS', 'DEFAULT_CASES', 'build_detector', 'synthetic_batch',
           'detector_step', 'detector_comparison', 'detector_memory_step']

DETECTOR_CONFIGS: Dict[str, Tuple[str, str]] = {
    'mask-rcnn': ('mmdet', 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'),
    'upernet': ('mmseg', 'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_'
                'ade20k-512x512.py'),
}
NUM_OBJECTS = 6
# The size each model is measured at unless told: COCO's test scale for Mask R-CNN (one image),
# the ADE20K crop for UperNet (two: its pyramid pooling's BatchNorm needs more than one value per
# channel in training).
DEFAULT_CASES = {'mask-rcnn': ((800, 1216), 1), 'upernet': ((512, 512), 2)}


def build_detector(name: str, which: str, state_dict=None) -> torch.nn.Module:
    """The stock model of ``DETECTOR_CONFIGS[name]`` ('mmdet' side: its own Swin) or ours
    (``which='ours'``: our backbone swapped in), seeded, optionally loading ``state_dict``."""
    from mmengine.hub import get_config
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import MODELS, init_default_scope
    if name not in DETECTOR_CONFIGS:
        raise ValueError(f'detector {name!r} is not one of {sorted(DETECTOR_CONFIGS)}')
    scope, path = DETECTOR_CONFIGS[name]
    cfg = get_config(path)  # 'mmdet::...': the installed toolkit's own file
    cfg.model.pop('pretrained', None)
    backbone = cfg.model.backbone
    backbone.pop('init_cfg', None), backbone.pop('pretrained', None)
    if which == 'ours':  # registered in our scope by the import of swin_rpe_plugin
        backbone.type = 'swin_rpe_plugin.SwinTransformer'
    init_default_scope(scope)
    torch.manual_seed(0)
    model = revert_sync_batchnorm(MODELS.build(cfg.model))  # SyncBN -> BN on CPU
    model.init_weights()
    if state_dict is not None:
        model.load_state_dict(state_dict, strict=True)
    return model


def synthetic_batch(model: torch.nn.Module, shape: Tuple[int, int], training: bool,
                    batch: int = 1, seed: int = 0) -> dict:
    """``batch`` [3, H, W] images of random pixels, each with NUM_OBJECTS rectangles as boxes +
    masks (detectors) or as classes of a seg map (segmentors), through the preprocessor."""
    g = torch.Generator().manual_seed(seed)
    images, samples = [], []
    for _ in range(batch):
        image, sample = _synthetic_image(model, shape, g)
        images.append(image), samples.append(sample)
    return model.data_preprocessor(dict(inputs=images, data_samples=samples), training)


def _synthetic_image(model: torch.nn.Module, shape: Tuple[int, int], g: torch.Generator):
    h, w = shape
    image = torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8)
    y0 = torch.randint(0, h // 2, (NUM_OBJECTS, ), generator=g)
    x0 = torch.randint(0, w // 2, (NUM_OBJECTS, ), generator=g)
    y1 = y0 + torch.randint(h // 8, h // 2, (NUM_OBJECTS, ), generator=g)
    x1 = x0 + torch.randint(w // 8, w // 2, (NUM_OBJECTS, ), generator=g)
    labels = torch.randint(0, 20, (NUM_OBJECTS, ), generator=g)
    meta = dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w), scale_factor=(1.0, 1.0))
    if type(model).__module__.startswith('mmseg'):
        from mmengine.structures import PixelData
        from mmseg.structures import SegDataSample
        seg = torch.zeros(1, h, w, dtype=torch.long)
        for i in range(NUM_OBJECTS):
            seg[:, y0[i]:y1[i], x0[i]:x1[i]] = labels[i] + 1
        sample = SegDataSample(metainfo=meta)
        sample.gt_sem_seg = PixelData(data=seg)
    else:
        from mmdet.structures import DetDataSample
        from mmdet.structures.mask import BitmapMasks
        from mmengine.structures import InstanceData
        masks = torch.zeros(NUM_OBJECTS, h, w, dtype=torch.uint8)
        for i in range(NUM_OBJECTS):
            masks[i, y0[i]:y1[i], x0[i]:x1[i]] = 1
        sample = DetDataSample(metainfo=meta)
        sample.gt_instances = InstanceData(
            bboxes=torch.stack([x0, y0, x1, y1], 1).float(), labels=labels,
            masks=BitmapMasks(masks.numpy(), h, w))
    return image, sample


def _optim_wrapper(model: torch.nn.Module, dtype: str):
    """What tools/train.py wraps the model's step in: autocast on backbone + neck for bf16."""
    from mmengine.optim import OptimWrapper

    from swin_rpe_plugin.optim import AutocastOptimWrapper
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    if dtype == 'fp32':
        return OptimWrapper(optimizer=optimizer)
    if dtype != 'bf16':
        raise ValueError(f'whole models run in fp32 or bf16 on CPU, not {dtype!r}: mmcv\'s CPU '
                         'ops have no fp16 kernels')
    return AutocastOptimWrapper(optimizer=optimizer, autocast_modules=['backbone', 'neck'])


def detector_step(model: torch.nn.Module, mode: str, dtype: str = 'fp32',
                  release_grads: bool = True):
    """step(data) for one predict (mode 'infer') or one loss + backward (mode 'train');
    ``release_grads``: the train step sets the gradients to None after its backward."""
    wrapper = _optim_wrapper(model, dtype)
    if mode == 'infer':
        model.eval()

        def run(data):
            with torch.no_grad(), wrapper.optim_context(model):
                return model(**data, mode='predict')
    else:
        model.train()

        def run(data):
            with wrapper.optim_context(model):
                losses = model(**data, mode='loss')
            loss, log = model.parse_losses(losses)
            loss.backward()
            if release_grads:
                for p in model.parameters():
                    p.grad = None
            return log
    return run


def model_gflops(model: torch.nn.Module, shape: Tuple[int, int]) -> float:
    """Forward GFLOPs of the whole model in tensor mode (mmdet's / mmseg's get_flops recipe)."""
    from swin_rpe_plugin.analysis.complexity import flop_analyzer
    from swin_rpe_plugin.analysis.models import config_inputs
    inputs, samples = config_inputs(model, shape)

    class Tensor(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(x, samples, mode='tensor')
    with torch.no_grad():
        return 2 * flop_analyzer(Tensor().eval(), (inputs, )).total() / 1e9


_WEIGHTS = []  # one temporary folder per process for the weights the memory children load


def _weights_file(state_dict) -> str:
    if not _WEIGHTS:
        _WEIGHTS.append(tempfile.mkdtemp(prefix='swin_rpe_bench_'))
        atexit.register(shutil.rmtree, _WEIGHTS[0], True)
    path = os.path.join(_WEIGHTS[0], f'weights_{len(os.listdir(_WEIGHTS[0]))}.pt')
    torch.save(state_dict, path)
    return path


def detector_memory_step(name: str, which: str, shape, batch: int, mode: str, dtype: str,
                         weights: str):
    """(step, data) of one side, built alone; weights are memory-mapped and released before the
    step, so the child's resident size before it holds one model."""
    state = torch.load(weights, mmap=True, weights_only=True)
    model = build_detector(name, which, state)
    del state
    return (detector_step(model, mode, dtype),
            synthetic_batch(model, tuple(shape), mode == 'train', batch))


def detector_comparison(name: str, shape: Tuple[int, int], mode: str, dtype: str = 'fp32',
                        batch: int = 1) -> Comparison:
    """The stock model against the same model with our backbone, same weights and input.

    max_abs_diff: the largest difference of the backbone + neck features (tensor mode on the
    same batch, ``dtype``'s autocast on backbone and neck) between the two.
    """
    if name == 'upernet' and mode == 'train' and batch < 2:
        raise ValueError('UperNet trains with batch >= 2 (its pyramid pooling BatchNorm sees one '
                         'value per channel with one image): pass batch 2')
    stock = build_detector(name, 'mmdet')
    ours = build_detector(name, 'ours', stock.state_dict())
    data = synthetic_batch(stock, shape, mode == 'train', batch)
    # The record names the size the model ran at: mmseg's preprocessor pads training batches
    # up to the config's crop (512 x 512), whatever size was asked for.
    requested, shape = tuple(shape), tuple(data['inputs'].shape[-2:])
    stock.eval(), ours.eval()
    feats = []
    for model in (stock, ours):
        with torch.no_grad(), _optim_wrapper(model, dtype).optim_context(model):
            feats.append(model.extract_feat(data['inputs']))
    diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(*feats))
    weights = _weights_file(stock.state_dict())
    memory = {which: ChildStep(f'{__name__}:detector_memory_step',
                               dict(name=name, which=which, shape=list(shape), batch=batch,
                                    mode=mode, dtype=dtype, weights=weights))
              for which in ('mmdet', 'ours')}
    gflops = model_gflops(stock, shape) * (3 if mode == 'train' else 1)
    key = dict(kind='detector', arch=name, shape=list(shape), batch=batch, mode=mode,
               dtype=dtype, **({} if requested == shape else {'requested_shape': list(requested)}))
    steps = {'mmdet': detector_step(stock, mode, dtype), 'ours': detector_step(ours, mode, dtype)}
    return Comparison(key, steps, data, baseline='mmdet', gflops=gflops, roof_dtype=dtype,
                      checks=dict(max_abs_diff=diff), memory=memory)
