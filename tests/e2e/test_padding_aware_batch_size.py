"""tools/test.py --batch-size N on varied-size synthetic images: with --padding-aware, every
image gets the same detections at batch 1 and batch 3, and the same metrics (RetinaNet: small
enough to test every image at both batch sizes; the masks are held in
tests/models/test_padding_aware_models.py)."""
import os

import pytest
import torch

from swin_rpe_plugin.datasets import make_synthetic_data
from swin_rpe_plugin.engine.padding import batch_test_options, measure_batch_sizes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, 'configs/synthetic/retinanet_swin-rpe-tiny_fpn_shapes.py')
# Random weights: detections above 0.05 exist; no top-k cut of proposals or detections, where
# near-equal random scores would tie.
OPTIONS = {'model.test_cfg.nms_pre': 100000, 'model.test_cfg.max_per_img': 100000,
           'model.test_cfg.score_thr': 0.05, 'model.backbone.drop_path_rate': 0.0}


@pytest.fixture(scope='module')
def data_and_checkpoint(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('padding_aware')
    make_synthetic_data(str(tmp / 'data'), num_train=1, num_val=4, seed=5, progress=False,
                        size_range=(64, 160))
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    from swin_rpe_plugin.engine import load_config
    cfg = load_config(CONFIG, OPTIONS)
    init_default_scope('mmdet')
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    with torch.no_grad():  # unit-gain random weights: scores away from their init prior
        for m in model.modules():
            if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
                m.weight.normal_(0, 1.0 / m.weight[0].numel() ** 0.5)
                if m.bias is not None:
                    m.bias.normal_(0, 0.1)
    ckpt = str(tmp / 'random.pth')
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, ckpt)
    return str(tmp / 'data' / 'coco'), ckpt, str(tmp / 'work')


def test_batch_size_sets_the_test_loader_and_padding_aware_the_two_lines():
    opts = batch_test_options(CONFIG, None, 4, True)
    assert opts['test_dataloader.batch_size'] == 4
    assert opts['model.backbone.mask_padding'] is True
    hooks = [h['type'] for h in opts['custom_hooks']]
    assert hooks == ['swin_rpe_plugin.RNGStateHook', 'swin_rpe_plugin.PaddingAwareHook']
    assert batch_test_options(CONFIG, {'a': 1}) == {'a': 1}


def test_bad_batch_size_is_one_line(capsys):
    import importlib.util
    spec = importlib.util.spec_from_file_location('tools_test', os.path.join(ROOT,
                                                                              'tools/test.py'))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main([CONFIG, CONFIG, '--batch-size', '0']) == 2
    err = capsys.readouterr().err.strip()
    assert err == 'error: --batch-size must be >= 1, got 0'


def test_padding_aware_predictions_do_not_depend_on_the_batch_size(data_and_checkpoint):
    data, ckpt, work = data_and_checkpoint
    rows = measure_batch_sizes(CONFIG, ckpt, (1, 3), padding_aware=True, data_root=data,
                               cfg_options=OPTIONS, work_dir=work)
    assert rows[0]['images'] == rows[1]['images'] == 4
    worst = rows[1]['worst']
    assert worst['moved'] == 0
    assert worst['box'] <= 0.01 and worst['score'] <= 1e-4
    assert rows[0]['metrics'] == rows[1]['metrics']
    off = measure_batch_sizes(CONFIG, ckpt, (1, 3), padding_aware=False, data_root=data,
                              cfg_options=OPTIONS, work_dir=work)[1]['worst']
    assert off['box'] > 0.01 or off['score'] > 1e-4  # what the option keeps out
    print(f'\nbatch 3 vs 1, worst: on {worst}, off {off}')
