"""tools/train.py, tools/test.py and tools/dist_train.sh on the tiny configs and synthetic data."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import free_port, short
from swin_rpe_plugin.datasets import make_synthetic_data
from swin_rpe_plugin.engine import (CheckpointMismatchError, ConfigArgumentError,
                                    MissingPathError, load_config)
from swin_rpe_plugin.engine.config import adapt_to_device, check_backbone_arguments, \
    check_data_paths
from swin_rpe_plugin.engine.demo import options_argv, read_scalars, synthetic_options

pytestmark = pytest.mark.heavy  # minutes: scheduled first (tests/conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEG = os.path.join(ROOT, 'configs/synthetic/upernet_swin-rpe-tiny_shapes-128x128.py')
DET = os.path.join(ROOT, 'configs/synthetic/mask-rcnn_swin-rpe-tiny_fpn_shapes.py')
PY = sys.executable


def tool(*args, env=None):
    return subprocess.run([*args], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})))


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('data'))
    make_synthetic_data(root, num_train=8, num_val=3, seed=1, progress=False)
    return root


@pytest.fixture(scope='module')
def trained(data, tmp_path_factory):
    """20 iterations of the tiny UperNet; the work dir."""
    work = str(tmp_path_factory.mktemp('train'))
    opts = {**synthetic_options('mmseg', data), **short(20)}
    proc = tool(PY, 'tools/train.py', SEG, '--work-dir', work, *options_argv(opts))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'rank 0/1: training finished' in proc.stdout
    return work


def test_short_training_lowers_the_loss(trained):
    losses = [(r['iter'], r['loss']) for r in read_scalars(trained) if 'loss' in r]
    assert [i for i, _ in losses] == list(range(2, 21, 2))
    first = losses[0][1]
    last = sum(l for _, l in losses[-3:]) / 3
    assert last < 0.9 * first, losses
    assert os.path.isfile(os.path.join(trained, 'iter_20.pth'))


def test_test_tool_reports_metrics_and_pictures(trained, data, tmp_path):
    out = tmp_path / 'metrics.json'
    proc = tool(PY, 'tools/test.py', SEG, os.path.join(trained, 'iter_20.pth'), '--work-dir',
                str(tmp_path / 'work'), '--out-metrics', str(out), '--show-dir',
                str(tmp_path / 'pictures'), *options_argv(synthetic_options('mmseg', data)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads(out.read_text())
    assert 0 <= metrics['mIoU'] <= 100 and 0 <= metrics['aAcc'] <= 100
    assert f'mIoU={metrics["mIoU"]:.4f}' in proc.stdout
    assert len(os.listdir(tmp_path / 'pictures')) >= 1


def test_resume_continues_from_the_saved_iteration(trained, data, tmp_path):
    # Reads an mmengine checkpoint (message hub, optimizer, meta) with weights_only loading.
    work = str(tmp_path / 'resumed')
    opts = {**synthetic_options('mmseg', data), **short(22)}
    proc = tool(PY, 'tools/train.py', SEG, '--work-dir', work, '--resume',
                os.path.join(trained, 'iter_20.pth'), *options_argv(opts))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r['iter'] for r in read_scalars(work) if 'loss' in r] == [22]
    assert os.path.isfile(os.path.join(work, 'iter_22.pth'))


def test_checkpoint_that_does_not_fit_is_refused_by_key(trained, data, tmp_path):
    from swin_rpe_plugin.checkpoint.compat import allow_mmengine_checkpoints
    allow_mmengine_checkpoints()
    state = torch.load(os.path.join(trained, 'iter_20.pth'), map_location='cpu')['state_dict']
    state['decode_head.conv_seg.weight'] = state['decode_head.conv_seg.weight'][:3]
    bad = str(tmp_path / 'bad.pth')
    torch.save({'state_dict': state}, bad)
    proc = tool(PY, 'tools/test.py', SEG, bad, '--work-dir', str(tmp_path / 'w'),
                *options_argv(synthetic_options('mmseg', data)))
    assert proc.returncode == 2 and 'Traceback' not in proc.stderr
    # The stack's own deprecation warnings come first; the error is one line at the end.
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: checkpoint {bad!r} does not fit the model: decode_head.conv_seg.weight has "
        "shape (3, 64, 1, 1) in the checkpoint, (5, 64, 1, 1) in the model (1 such keys)")
    del state['decode_head.conv_seg.bias']
    state['decode_head.conv_seg.weight'] = state['decode_head.conv_seg.weight'].new_zeros(
        5, 64, 1, 1)
    torch.save({'state_dict': state}, bad)
    from swin_rpe_plugin.engine.run import check_checkpoint_fits
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    cfg = load_config(SEG)
    adapt_to_device(cfg)
    init_default_scope('mmseg')
    with pytest.raises(CheckpointMismatchError, match=r"1 model keys missing \(first: "
                       r"\['decode_head.conv_seg.bias'\]\)"):
        check_checkpoint_fits(MODELS.build(cfg.model), bad)


def test_distributed_training_two_gloo_processes(data, tmp_path):
    work = str(tmp_path / 'dist')
    opts = {**synthetic_options('mmseg', data), **short(2, warmup=1, batch=2)}
    proc = tool('bash', 'tools/dist_train.sh', SEG, '2', '--work-dir', work,
                *options_argv(opts), env={'PORT': str(free_port()), 'PYTHON': PY})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'rank 0/2: training finished' in proc.stdout
    assert 'rank 1/2: training finished' in proc.stdout
    assert os.path.isfile(os.path.join(work, 'iter_2.pth'))
    with open(os.path.join(work, 'last_checkpoint')) as f:
        assert f.read().strip().endswith('iter_2.pth')


def test_missing_data_root_is_one_line_naming_the_path(tmp_path):
    missing = str(tmp_path / 'nowhere')
    proc = tool(PY, 'tools/train.py', DET, '--work-dir', str(tmp_path / 'w'),
                *options_argv(synthetic_options('mmdet', missing)))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: train_dataloader.dataset.data_root: directory not found: '{missing}/coco/'; "
        "pass --data-root DIR (the folder holding the annotations and images; for the "
        "synthetic sets, tools/make_synthetic_data.py writes DIR/coco and DIR/ade)"]


def test_missing_annotation_file_and_config_are_named(data, tmp_path):
    cfg = load_config(DET, {**synthetic_options('mmdet', data),
                            'test_dataloader.dataset.ann_file': 'annotations/none.json'})
    check_data_paths(cfg, ('train_dataloader',))
    with pytest.raises(MissingPathError, match=r"test_dataloader\.dataset\.ann_file: file not "
                       r"found: '.*/coco/annotations/none\.json'"):
        check_data_paths(cfg, ('test_dataloader',))
    with pytest.raises(MissingPathError, match="config file not found: 'nope.py'"):
        load_config('nope.py')


def test_unknown_backbone_argument_is_named(tmp_path):
    cfg = load_config(SEG, {'model.backbone.windw_size': 7})
    with pytest.raises(ConfigArgumentError,
                       match=r"model.backbone: SwinTransformer takes no argument 'windw_size'"):
        check_backbone_arguments(cfg)
    check_backbone_arguments(load_config(SEG))  # the config as written is fine
    proc = tool(PY, 'tools/train.py', SEG, '--work-dir', str(tmp_path / 'w'), '--cfg-options',
                'model.backbone.windw_size=7')
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "takes no argument 'windw_size'" in proc.stderr


def test_sync_bn_becomes_bn_without_cuda():
    cfg = load_config(SEG)
    assert cfg.model.decode_head.norm_cfg.type == 'SyncBN'
    adapt_to_device(cfg)
    if torch.cuda.is_available():  # with CUDA the config is left as written
        assert cfg.model.decode_head.norm_cfg.type == 'SyncBN'
        return
    assert cfg.model.decode_head.norm_cfg.type == 'BN'
    assert cfg.model.auxiliary_head.norm_cfg.type == 'BN'
    assert cfg.env_cfg.dist_cfg.backend == 'gloo'
