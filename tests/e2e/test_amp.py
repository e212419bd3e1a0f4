"""tools/train.py --amp on CPU: bf16 autocast through swin_rpe_plugin.AutocastOptimWrapper."""
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, short
from swin_rpe_plugin import compat
from swin_rpe_plugin.datasets import make_synthetic_data
from swin_rpe_plugin.engine import UsageError, load_config
from swin_rpe_plugin.engine.demo import options_argv, read_scalars, synthetic_options
from swin_rpe_plugin.engine.run import use_amp

pytestmark = pytest.mark.heavy  # minutes: scheduled first (tests/conftest.py)

CONFIGS = {
    'mmseg': os.path.join(ROOT, 'configs/synthetic/upernet_swin-rpe-tiny_shapes-128x128.py'),
    'mmdet': os.path.join(ROOT, 'configs/synthetic/mask-rcnn_swin-rpe-tiny_fpn_shapes.py'),
}
ITERS = 16


def train(config, work, opts, *extra):
    return subprocess.run([sys.executable, 'tools/train.py', config, '--work-dir', work,
                           '--amp', *extra, *options_argv(opts)],
                          cwd=ROOT, capture_output=True, text=True)


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('data'))
    make_synthetic_data(root, num_train=8, num_val=3, seed=1, progress=False)
    return root


@pytest.mark.parametrize('toolkit', ['mmseg', 'mmdet'])
def test_amp_training_on_cpu_falls_and_resumes(toolkit, data, tmp_path):
    work = str(tmp_path / 'amp')
    opts = {**synthetic_options(toolkit, data), **short(ITERS)}
    proc = train(CONFIGS[toolkit], work, opts)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dumped = [f for f in os.listdir(work) if f.endswith('.py')]  # the Runner's config dump
    with open(os.path.join(work, dumped[0])) as f:
        assert "type='swin_rpe_plugin.AutocastOptimWrapper'" in f.read()
    losses = [r['loss'] for r in read_scalars(work) if 'loss' in r]
    assert len(losses) == ITERS // 2 and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-3:]) / 3 < 0.9 * losses[0], losses

    from swin_rpe_plugin.checkpoint.compat import allow_mmengine_checkpoints
    allow_mmengine_checkpoints()
    ckpt = torch.load(os.path.join(work, f'iter_{ITERS}.pth'), map_location='cpu')
    assert {v.dtype for v in ckpt['state_dict'].values() if v.is_floating_point()} == \
        {torch.float32}  # weights stay float32: autocast only changes the products

    resumed = str(tmp_path / 'resumed')
    opts = {**synthetic_options(toolkit, data), **short(ITERS + 2)}
    proc = train(CONFIGS[toolkit], resumed, opts, '--resume',
                 os.path.join(work, f'iter_{ITERS}.pth'))
    assert proc.returncode == 0, proc.stderr[-3000:]
    scalars = [r for r in read_scalars(resumed) if 'loss' in r]
    assert [r['iter'] for r in scalars] == [ITERS + 2]
    assert torch.isfinite(torch.tensor(scalars[0]['loss']))


def test_autocast_wrapper_runs_the_forward_in_bf16_and_keeps_fp32_weights():
    from mmengine.optim import build_optim_wrapper
    model = torch.nn.Linear(4, 3)
    wrapper = build_optim_wrapper(model, dict(type='swin_rpe_plugin.AutocastOptimWrapper',
                                              optimizer=dict(type='SGD', lr=0.1)))
    with wrapper.optim_context(model):
        out = model(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16
    wrapper.update_params(out.float().square().mean())
    assert model.weight.dtype == torch.float32 and model.weight.grad is None  # zeroed
    assert not compat.autocast_enabled('cpu')


def test_autocast_modules_limit_autocast_to_those_submodules():
    from mmengine.optim import build_optim_wrapper
    model = torch.nn.Module()
    model.backbone = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    model.head = torch.nn.Linear(4, 2)
    seen = {}
    for name, module in [('backbone.0', model.backbone[0]), ('head', model.head)]:
        module.register_forward_hook(lambda m, a, out, name=name: seen.update({name: out.dtype}))
    wrapper = build_optim_wrapper(model, dict(type='swin_rpe_plugin.AutocastOptimWrapper',
                                              autocast_modules=['backbone'],
                                              optimizer=dict(type='SGD', lr=0.1)))
    with wrapper.optim_context(model):
        features = model.backbone(torch.randn(2, 4))
        out = model.head(features)
    assert seen == {'backbone.0': torch.bfloat16, 'head': torch.float32}
    assert features.dtype == torch.float32 and out.dtype == torch.float32
    model.backbone(torch.randn(2, 4))  # hooks removed when the context closed
    assert seen['backbone.0'] == torch.float32
    bad = build_optim_wrapper(model, dict(type='swin_rpe_plugin.AutocastOptimWrapper',
                                          autocast_modules=['neck'],
                                          optimizer=dict(type='SGD', lr=0.1)))
    with pytest.raises(ValueError, match="no submodule 'neck'; choose among"):
        with bad.optim_context(model):
            pass


def test_amp_choices_are_named():
    cfg = load_config(CONFIGS['mmseg'])
    if torch.cuda.is_available():
        use_amp(cfg)
        assert cfg.optim_wrapper.type == 'AmpOptimWrapper'
        assert cfg.optim_wrapper.dtype == 'float16'
        return
    use_amp(cfg)
    assert cfg.optim_wrapper.type == 'swin_rpe_plugin.AutocastOptimWrapper'
    assert cfg.optim_wrapper.dtype == 'bfloat16'
    assert 'autocast_modules' not in cfg.optim_wrapper  # mmseg heads run in bf16 too
    det = load_config(CONFIGS['mmdet'])
    use_amp(det)
    assert det.optim_wrapper.autocast_modules == ['backbone', 'neck']  # mmcv CPU ops: fp32
    with pytest.raises(UsageError, match='--amp-dtype fp16 needs CUDA'):
        use_amp(load_config(CONFIGS['mmseg']), 'fp16')
    with pytest.raises(ValueError, match='only bfloat16 trains without a loss scale'):
        from swin_rpe_plugin import AutocastOptimWrapper
        AutocastOptimWrapper(dtype='float16', optimizer=torch.optim.SGD(
            torch.nn.Linear(1, 1).parameters(), lr=0.1))
