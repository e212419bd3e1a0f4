"""tools/export_onnx.py --checkpoint with the detector tools/train.py saved (issue 18, item 5).

A synthetic Mask R-CNN trains 2 iterations and is saved by tools/train.py; each part is exported
from that file and run in ONNX Runtime. The reference is independent of the loading code under
test: the same config's model with the file's state dict put in by torch's own
``load_state_dict(strict=True)``, run eagerly.
"""
import os
import subprocess
import sys

import pytest
import torch

from conftest import short
from swin_rpe_plugin.checkpoint import read_checkpoint
from swin_rpe_plugin.datasets import make_synthetic_data
from swin_rpe_plugin.deploy import ExportPart, get_runtime, verify
from swin_rpe_plugin.engine.demo import options_argv, synthetic_options

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DET = os.path.join(ROOT, 'configs/synthetic/mask-rcnn_swin-rpe-tiny_fpn_shapes.py')


def tool(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """The checkpoint tools/train.py saves after 2 iterations of the tiny Mask R-CNN."""
    root = str(tmp_path_factory.mktemp('data'))
    make_synthetic_data(root, num_train=4, num_val=1, seed=1, progress=False)
    work = str(tmp_path_factory.mktemp('train'))
    opts = {**synthetic_options('mmdet', root), **short(2, warmup=1, batch=2)}
    proc = tool('tools/train.py', DET, '--work-dir', work, *options_argv(opts))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return os.path.join(work, 'iter_2.pth')


def reference_model(checkpoint):
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    from swin_rpe_plugin.engine.config import adapt_to_device, load_config
    cfg = load_config(DET)
    adapt_to_device(cfg)
    init_default_scope('mmdet')
    model = MODELS.build(cfg.model)
    model.load_state_dict(read_checkpoint(checkpoint)['state_dict'], strict=True)
    return model.eval()


@pytest.mark.parametrize('part,outputs', [('backbone', 4), ('neck', 5), ('model', 15)])
def test_trained_detector_exports_every_part_with_its_weights(trained, tmp_path, part, outputs):
    out = str(tmp_path / f'{part}.onnx')
    proc = tool('tools/export_onnx.py', DET, '--checkpoint', trained, '--out', out, '--part',
                part, '--shape', '128', '160', '--exporter', 'classic')
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f'weights from {trained} (whole model' in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith('ok: max abs diff')
    reference = ExportPart(reference_model(trained), part).eval()
    inputs = [torch.randn(1, 3, 128, 160), torch.randn(2, 3, 97, 201)]
    run = get_runtime('onnxruntime').load(out)
    for record in verify(run, reference, inputs):
        assert len(record['max_abs_diff']) == outputs
        assert max(record['max_abs_diff']) <= 1e-4, record


def test_a_backbone_checkpoint_exports_the_backbone_and_not_the_neck(trained, tmp_path):
    state = read_checkpoint(trained)['state_dict']
    backbone = {k[len('backbone.'):]: v for k, v in state.items() if k.startswith('backbone.')}
    path = str(tmp_path / 'backbone.pth')
    torch.save({'state_dict': backbone}, path)
    out = str(tmp_path / 'b.onnx')
    proc = tool('tools/export_onnx.py', DET, '--checkpoint', path, '--out', out, '--shape',
                '64', '64', '--exporter', 'classic')
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = ExportPart(reference_model(trained), 'backbone').eval()
    record, = verify(get_runtime('onnxruntime').load(out), reference, [torch.randn(1, 3, 64, 80)])
    assert max(record['max_abs_diff']) <= 1e-4, record

    proc = tool('tools/export_onnx.py', DET, '--checkpoint', path, '--out', out, '--part', 'neck')
    assert proc.returncode == 2 and 'Traceback' not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f'error: {path} holds a backbone alone (16 tensors of the exported parts missing): '
        'give a whole-model checkpoint saved with this config, or export --part backbone')
