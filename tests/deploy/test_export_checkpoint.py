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

pytestmark = pytest.mark.heavy  # minutes: scheduled first (tests/conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DET = os.path.join(ROOT, 'configs/synthetic/mask-rcnn_swin-rpe-tiny_fpn_shapes.py')


def tool(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('data'))
    make_synthetic_data(root, num_train=4, num_val=2, seed=1, progress=False)
    return root


@pytest.fixture(scope='module')
def trained(data, tmp_path_factory):
    """The checkpoint tools/train.py saves after 2 iterations of the tiny Mask R-CNN."""
    root = data
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


def test_trained_detector_in_openvino_f32_bf16_int8_and_its_metrics(trained, data, tmp_path):
    from swin_rpe_plugin.deploy import openvino as ovd
    out = str(tmp_path / 'neck.onnx')
    proc = tool('tools/export_onnx.py', DET, '--checkpoint', trained, '--out', out, '--part',
                'neck', '--shape', '128', '160', '--exporter', 'classic', '--openvino', '--int8',
                os.path.join(data, 'coco', 'train'), '--calibration-count', '2', '--evaluate',
                os.path.join(data, 'coco'))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for name in ('neck.xml', 'neck.bin', 'neck_int8.xml', 'neck_int8.bin'):
        assert os.path.isfile(tmp_path / name), name
    f32 = [l for l in lines if l.startswith('openvino f32 vs pytorch at ')]
    assert [l.split(': ')[0].rsplit(' ', 1)[1] for l in f32] == [
        '1x3x128x160', '1x3x97x201', '2x3x67x89']
    assert all(float(l.split('max abs diff ')[1].split(',')[0]) <= 1e-4 for l in f32), f32
    native = 'BF16' in ovd.cpu_capabilities()
    assert any(l.startswith('bf16 hint: this CPU has ' + ('native bf16' if native else
                                                          'no native bf16')) for l in lines)
    int8, = [l for l in lines if l.startswith('openvino int8 vs pytorch at ')]
    assert int8.split(': ')[0].endswith('at 2x3x128x160')  # the 2 images it did not calibrate on
    metrics = {l.split(': ')[0]: l.split(': ')[1] for l in lines if l.startswith('neck in ')}
    assert list(metrics) == ['neck in eager fp32', 'neck in openvino f32', 'neck in openvino int8']
    eager = dict(kv.split('=') for kv in metrics['neck in eager fp32'].split(', '))
    assert 'coco/bbox_mAP' in eager
    f32 = dict(kv.split('=') for kv in metrics['neck in openvino f32'].split(', '))
    assert list(f32) == list(eager)
    assert all(abs(float(f32[k].split(' ')[0]) - float(eager[k])) <= 1e-3 for k in eager)


def test_a_checkpoint_of_another_shape_is_refused_by_key(trained, tmp_path):
    from swin_rpe_plugin.deploy import build_export_part
    ckpt = read_checkpoint(trained)
    key = 'neck.lateral_convs.0.conv.weight'
    ckpt['state_dict'][key] = ckpt['state_dict'][key][:32]
    path = str(tmp_path / 'other.pth')
    torch.save({'state_dict': ckpt['state_dict']}, path)
    with pytest.raises(ValueError, match=r'neck\.lateral_convs\.0\.conv\.weight has shape '
                       r'\(32, 32, 1, 1\) in the checkpoint and \(64, 32, 1, 1\) in the model'):
        build_export_part(DET, 'neck', path)
