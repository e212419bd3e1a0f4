"""ONNX export with dynamic batch, height and width: one file, right at every size.

The reference is eager PyTorch on the same weights; ONNX Runtime runs the exported file.
"""
import os
import subprocess
import sys

import pytest
import torch

from conftest import salient_bias_tables
from swin_rpe_plugin import SwinTransformer, compat
from swin_rpe_plugin.deploy import ExportPart, export_onnx, verify_onnx

pytestmark = pytest.mark.heavy  # minutes: scheduled first (tests/conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPORT_SIZE = (1, 3, 64, 96)
# Batch 2; odd sides; and 228 x 228, whose stage maps (57, 29, 15, 8) need window padding in
# every stage for windows 7 and (7, 12) alike (checked below).
CHECK_SIZES = [(2, 3, 64, 96), (1, 3, 97, 131), (1, 3, 228, 228), (2, 3, 45, 61)]


def tiny_backbone(window, mask_padding, stages=4):
    torch.manual_seed(0)
    model = SwinTransformer(embed_dims=16, depths=(2,) * stages,
                            num_heads=(1, 1, 2, 2)[:stages], strides=(4,) + (2,) * (stages - 1),
                            out_indices=tuple(range(stages)), window_size=window,
                            mask_padding=mask_padding, drop_path_rate=0.0)
    model.init_weights()
    return salient_bias_tables(model).eval()


def test_check_sizes_pad_in_every_stage():
    size = 228 // 4
    for _ in range(4):
        assert size % 7 and size % 12 or size < 12, size
        size = -(-size // 2)


def export_and_check(tmp_path, model, exporter):
    part = ExportPart(model, 'backbone')
    path = str(tmp_path / f'{exporter}.onnx')
    example = torch.randn(*EXPORT_SIZE)
    export_onnx(part, example, path, exporter, output_names=part.output_names(example))
    results = verify_onnx(path, part, [example] + [torch.randn(*s) for s in CHECK_SIZES])
    for record in results:
        assert max(record['max_abs_diff']) <= 1e-4, record


@pytest.mark.parametrize('mask_padding', [False, True], ids=['plain', 'mask_padding'])
@pytest.mark.parametrize('window', [7, (7, 12)], ids=['w7', 'w7x12'])
def test_classic_exporter_is_right_at_every_size(tmp_path, window, mask_padding):
    export_and_check(tmp_path, tiny_backbone(window, mask_padding), 'classic')


@pytest.mark.needs('HAS_DYNAMO_EXPORTER')
@pytest.mark.parametrize('window,mask_padding', [(7, False), ((7, 12), True)],
                         ids=['w7', 'w7x12-mask_padding'])
def test_dynamo_exporter_is_right_at_every_size(tmp_path, window, mask_padding):
    export_and_check(tmp_path, tiny_backbone(window, mask_padding, stages=2), 'dynamo')


def test_valid_sizes_cannot_be_exported_and_say_so(tmp_path):
    model = tiny_backbone(7, False, stages=2)

    class WithValidSizes(torch.nn.Module):
        def forward(self, x):
            return model(x, valid_sizes=[(x.shape[2], x.shape[3])] * x.shape[0])

    with pytest.raises(Exception, match='valid_sizes cannot be traced or exported'):
        torch.onnx.export(WithValidSizes(), (torch.randn(1, 3, 32, 32), ),
                          str(tmp_path / 'v.onnx'),
                          **({'dynamo': False} if compat.HAS_DYNAMO_EXPORTER else {}))


def tool(*args):
    return subprocess.run([sys.executable, 'tools/export_onnx.py', *args], cwd=ROOT,
                          capture_output=True, text=True)


def test_whole_mask_rcnn_exports_up_to_the_rpn(tmp_path):
    config = os.path.join(ROOT, 'configs/synthetic/mask-rcnn_swin-rpe-tiny_fpn_shapes.py')
    proc = tool(config, '--out', str(tmp_path / 'det.onnx'), '--part', 'model', '--shape',
                '128', '160', '--exporter', 'classic')
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [l for l in proc.stdout.splitlines() if l.startswith('onnxruntime vs pytorch at')]
    # export size, odd size, another batch; FPN's 5 levels + RPN's 5 + 5 raw outputs each
    assert len(lines) == 3 and all(len(l.split(': ')[1].split(', ')) == 15 for l in lines)
    assert proc.stdout.strip().splitlines()[-1].startswith('ok: max abs diff')


@pytest.mark.needs('HAS_DYNAMO_EXPORTER')  # --fixed-size: the classic exporter traces sizes
def test_upernet_whole_model_needs_a_fixed_size_and_says_why(tmp_path):
    config = os.path.join(ROOT, 'configs/synthetic/upernet_swin-rpe-tiny_shapes-128x128.py')
    proc = tool(config, '--out', str(tmp_path / 'seg.onnx'), '--part', 'model')
    assert proc.returncode == 2 and 'Traceback' not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        'error: --part model of ') and 'pools adaptively to (2, 2) cells' in proc.stderr
    proc = tool(config, '--out', str(tmp_path / 'seg.onnx'), '--part', 'model', '--shape',
                '128', '128', '--fixed-size')
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [l for l in proc.stdout.splitlines() if l.startswith('onnxruntime vs pytorch at')]
    assert [l.split(': ')[0].rsplit(' ', 1)[1] for l in lines] == [
        '1x3x128x128', '2x3x128x128', '3x3x128x128']
    assert proc.stdout.strip().splitlines()[-1].startswith('ok: max abs diff')
