"""A single-stage detector's whole model in OpenVINO (issue 20): the synthetic RetinaNet, exported
once with dynamic batch, height and width (``--part model``: every FPN level's class scores and
box deltas), converted to OpenVINO IR, gives eager PyTorch's outputs at the export size, at an
odd size and at batch 2; ONNX Runtime runs the same file.

Weights as built (what tools/export_onnx.py exports without --checkpoint) with bias tables that
matter; the reference is eager PyTorch on the same module. The classic exporter takes a second or
two here (the dynamo exporter about a minute).
"""
import os

import pytest
import torch
from mmdet.models import RetinaNet

from conftest import salient_bias_tables
from swin_rpe_plugin.deploy import build_export_part, export_onnx, get_runtime, verify
from swin_rpe_plugin.deploy import openvino as ovd

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, 'configs/synthetic/retinanet_swin-rpe-tiny_fpn_shapes.py')
EXPORT_SIZE = (1, 3, 128, 160)
# the export size; odd sides (padding in the patch embedding and window padding in every
# stage: maps 25x33, 13x17, 7x9, 4x5 for windows of 4); batch 2 at the odd size
SIZES = [EXPORT_SIZE, (1, 3, 97, 130), (2, 3, 97, 130)]
STRIDES = (8, 16, 32, 64, 128)  # FPN from stage 1, two extra levels


@pytest.fixture(scope='module')
def retinanet_export(tmp_path_factory):
    """(ExportPart of the whole RetinaNet, path of its dynamic ONNX export)."""
    torch.manual_seed(0)
    part = salient_bias_tables(build_export_part(CONFIG, 'model'))
    path = str(tmp_path_factory.mktemp('retinanet') / 'retinanet.onnx')
    example = torch.randn(*EXPORT_SIZE)
    export_onnx(part, example, path, 'classic', output_names=part.output_names(example))
    return part, path


@pytest.fixture(scope='module')
def inputs():
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(*size, generator=generator) for size in SIZES]


def test_the_part_is_every_levels_class_scores_and_box_deltas(retinanet_export, inputs):
    part, _ = retinanet_export
    assert isinstance(part.model, RetinaNet) and part.fixed_size_reason() is None
    assert part.children_used() == ['backbone', 'neck', 'bbox_head']
    head = part.model.bbox_head
    with torch.no_grad():
        outs = part(inputs[1])
    scores, deltas = outs[:len(STRIDES)], outs[len(STRIDES):]
    assert len(outs) == 2 * len(STRIDES)
    h, w = SIZES[1][2:]
    assert [tuple(s.shape) for s in scores] == [
        (1, head.num_base_priors * head.cls_out_channels, -(-h // s), -(-w // s)) for s in STRIDES]
    assert [tuple(d.shape) for d in deltas] == [
        (1, head.num_base_priors * 4, -(-h // s), -(-w // s)) for s in STRIDES]


@pytest.mark.parametrize('runtime', ['openvino', 'onnxruntime'])
def test_one_export_matches_eager_at_every_size(retinanet_export, inputs, runtime, tmp_path):
    part, path = retinanet_export
    if runtime == 'openvino':  # through the IR files, as tools/export_onnx.py --openvino writes
        model = ovd.read_onnx(path)
        assert ovd.dynamic_dims(model) == ['[?,3,?,?]']
        xml = str(tmp_path / 'retinanet.xml')
        ovd.save_ir(model, xml)
        run = ovd.compile_run(ovd.read_ir(xml), 'f32', threads=1)
    else:
        run = get_runtime(runtime).load(path, 'f32', threads=1)
    records = verify(run, part, inputs)
    assert [r['shape'] for r in records] == [list(s) for s in SIZES]
    for record in records:
        diffs = record['max_abs_diff']
        assert len(diffs) == 2 * len(STRIDES) and max(diffs) <= 1e-4, record
