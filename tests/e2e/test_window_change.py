"""A detector or segmentor saved at one window, loaded at another, by every path a user takes.

The reference for a resized table is torch's own bicubic interpolation of the saved table on its
(2M-1) x (2M-1) offset grid, computed here without the package.
"""
import logging
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from mmengine.logging import MMLogger

from swin_rpe_plugin.datasets import make_synthetic_data
from swin_rpe_plugin.engine import load_config
from swin_rpe_plugin.engine.config import adapt_to_device
from swin_rpe_plugin.engine.demo import options_argv, save_initial_checkpoint, synthetic_root

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DET = os.path.join(ROOT, 'configs/synthetic/mask-rcnn_swin-rpe-tiny_fpn_shapes.py')
SEG = os.path.join(ROOT, 'configs/synthetic/upernet_swin-rpe-tiny_shapes-128x128.py')
TABLE = 'relative_position_bias_table'
RESIZED = re.compile(r'backbone\.stages\.(\d): resized (\d) relative_position_bias_tables from '
                     r'window (\d+)x(\d+) \((\d+), (\d+)\) to the model window (\d+)x(\d+)')


def reference_resize(table: torch.Tensor, old: int, new: int) -> torch.Tensor:
    heads = table.shape[1]
    grid = table.t().reshape(1, heads, 2 * old - 1, 2 * old - 1)
    out = F.interpolate(grid, size=(2 * new - 1, 2 * new - 1), mode='bicubic',
                        align_corners=False)
    return out.reshape(heads, -1).t()


def build(config: str, window: int):
    import importlib
    from mmengine.registry import init_default_scope
    cfg = load_config(config, {'model.backbone.window_size': window})
    adapt_to_device(cfg)
    init_default_scope(cfg.default_scope)
    return importlib.import_module(f'{cfg.default_scope}.registry').MODELS.build(cfg.model)


@pytest.fixture(scope='module')
def det_w4(tmp_path_factory):
    """A whole Mask R-CNN checkpoint at window 4 with random (non-zero) bias tables."""
    path = str(tmp_path_factory.mktemp('ckpt') / 'det_w4.pth')
    save_initial_checkpoint(DET, path, seed=3)
    return path


def saved_state(path):
    from swin_rpe_plugin.checkpoint.compat import allow_mmengine_checkpoints
    allow_mmengine_checkpoints()
    return torch.load(path, map_location='cpu')['state_dict']


def assert_tables_resized(model, saved, old, new, prefix='backbone.'):
    tables = {k: v for k, v in model.state_dict().items() if k.endswith(TABLE)}
    assert len(tables) == 8
    for key, value in tables.items():
        assert saved[key].abs().max() > 0, key  # the source is not the initial value
        torch.testing.assert_close(value, reference_resize(saved[key], old, new),
                                   atol=1e-6, rtol=0)


class LogLines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_load_state_dict_of_whole_detector_resizes_and_logs_per_stage(det_w4):
    saved = saved_state(det_w4)
    model = build(DET, 7)
    handler = LogLines()
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        result = model.load_state_dict(saved, strict=True)
    finally:
        logger.removeHandler(handler)
    assert not result.missing_keys and not result.unexpected_keys
    assert_tables_resized(model, saved, 4, 7)
    stages = [RESIZED.search(line).groups() for line in handler.lines if RESIZED.search(line)]
    assert sorted(stages) == [(str(s), '2', '4', '4', '49', str(2 ** s), '7', '7')
                              for s in range(4)]
    others = [k for k in saved if TABLE not in k and 'relative_position_index' not in k]
    for key in others:  # everything else loads unchanged
        assert torch.equal(model.state_dict()[key], saved[key]), key


def test_init_detector_resizes(det_w4, tmp_path):
    from mmdet.apis import init_detector
    cfg = load_config(DET, {'model.backbone.window_size': 7})
    adapt_to_device(cfg)
    model = init_detector(cfg, det_w4, device='cpu')
    assert_tables_resized(model, saved_state(det_w4), 4, 7)


def test_mmseg_init_model_resizes(tmp_path):
    from mmseg.apis import init_model
    path = str(tmp_path / 'seg_w4.pth')
    save_initial_checkpoint(SEG, path, seed=4)
    cfg = load_config(SEG, {'model.backbone.window_size': 6})
    adapt_to_device(cfg)
    model = init_model(cfg, path, device='cpu')
    assert_tables_resized(model, saved_state(path), 4, 6)


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('data'))
    make_synthetic_data(root, num_train=4, num_val=2, seed=1, progress=False)
    return root


def train_tool(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    return subprocess.run([sys.executable, 'tools/train.py', *args], cwd=ROOT,
                          capture_output=True, text=True, env=env)


FROZEN = {'optim_wrapper.optimizer.lr': 0.0, 'train_cfg.max_iters': 1,
          'param_scheduler': None, 'default_hooks.checkpoint.interval': 1,
          'train_dataloader.batch_size': 2, 'val_cfg': None, 'val_dataloader': None,
          'val_evaluator': None, 'model.backbone.drop_path_rate': 0.0}


@pytest.fixture(scope='module')
def fine_tuned_w7(det_w4, data, tmp_path_factory):
    """tools/train.py at window 7 with load_from the window-4 checkpoint, lr 0, 1 iteration (one
    run serves both tests below): (work dir, the run's log)."""
    work = str(tmp_path_factory.mktemp('w7'))
    proc = train_tool(DET, '--work-dir', work, '--data-root', synthetic_root('mmdet', data),
                      *options_argv({**FROZEN, 'model.backbone.window_size': 7,
                                     'load_from': det_w4}))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work, proc.stdout + proc.stderr


def test_train_load_from_another_window_fine_tunes(det_w4, fine_tuned_w7):
    # lr 0: the weights of the saved checkpoint are exactly what load_from put in the model.
    work, log = fine_tuned_w7
    assert len(RESIZED.findall(log)) == 4, log[-3000:]
    assert 'size mismatch' not in log
    trained = saved_state(os.path.join(work, 'iter_1.pth'))
    saved = saved_state(det_w4)
    for key in (k for k in saved if k.endswith(TABLE)):
        torch.testing.assert_close(trained[key], reference_resize(saved[key], 4, 7),
                                   atol=1e-6, rtol=0)


def test_resume_at_another_window_is_refused(fine_tuned_w7, data, tmp_path):
    # A run trained by tools/train.py at window 7, resumed at the config's window 4.
    ckpt = os.path.join(fine_tuned_w7[0], 'iter_1.pth')
    proc = train_tool(DET, '--work-dir', str(tmp_path / 'r'), '--data-root',
                      synthetic_root('mmdet', data), '--resume', ckpt,
                      *options_argv({**FROZEN, 'train_cfg.max_iters': 2}))
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f'error: --resume: {ckpt!r} was trained at another window '
                           '(backbone.stages.0.blocks.0.attn.w_msa.relative_position_bias_table:'
                           ' (169, 1) in the checkpoint, (49, 1) in the model; 8 such tables)')
    assert f'load_from={ckpt}' in last and 'Traceback' not in proc.stderr


def test_convert_whole_detector_keeps_every_key(det_w4, tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        'convert_checkpoint', os.path.join(ROOT, 'tools', 'convert_checkpoint.py'))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    out = str(tmp_path / 'det_w7.pth')
    assert tool.main([det_w4, out, '--window', '7']) == 0
    saved, converted = saved_state(det_w4), saved_state(out)
    derived = {k for k in saved if k.endswith('relative_position_index')}
    assert set(converted) == set(saved) - derived
    for key, value in saved.items():
        if key.endswith(TABLE):
            torch.testing.assert_close(converted[key], reference_resize(value, 4, 7),
                                       atol=1e-6, rtol=0)
        elif key not in derived:
            assert torch.equal(converted[key], value), key
    model = build(DET, 7)
    model.load_state_dict(converted, strict=True)  # fits with nothing left to resize


def test_test_tool_accepts_another_window(det_w4, data, tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    proc = subprocess.run(
        [sys.executable, 'tools/test.py', DET, det_w4, '--work-dir', str(tmp_path / 't'),
         '--data-root', synthetic_root('mmdet', data),
         '--cfg-options', 'model.backbone.window_size=7'],
        cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(RESIZED.findall(proc.stdout + proc.stderr)) == 4
    assert 'bbox_mAP=' in proc.stdout
