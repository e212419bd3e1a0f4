"""The runtime adapters run our dynamic ONNX export right at every size, on the real runtimes.

Reference: eager PyTorch on the same weights. The tiny backbone is exported once per module
(the classic exporter: a few seconds)."""
import numpy as np
import pytest
import torch

from swin_rpe_plugin.deploy import (DEFAULT_EXPORTER, RUNTIMES, ExportPart, export_onnx,
                                    get_runtime, verify)
from swin_rpe_plugin.deploy import openvino as ovd
from test_onnx_export import EXPORT_SIZE, tiny_backbone

@pytest.fixture(scope='module')
def tiny_export(tmp_path_factory):
    """(ExportPart of a tiny 2-stage backbone, path of its dynamic ONNX export)."""
    part = ExportPart(tiny_backbone(7, False, stages=2), 'backbone').eval()
    path = str(tmp_path_factory.mktemp('tiny') / 'tiny_backbone.onnx')
    example = torch.randn(*EXPORT_SIZE)
    export_onnx(part, example, path, 'classic', output_names=part.output_names(example))
    return part, path


# export size, odd sides (window padding in both stages), another batch at a third size
SIZES = [(1, 3, 64, 96), (1, 3, 97, 131), (3, 3, 45, 61)]


def test_unknown_runtime_is_a_one_line_error():
    with pytest.raises(ValueError, match="unknown runtime 'tensorrt': choose one of "
                                         'onnxruntime, openvino'):
        get_runtime('tensorrt')


@pytest.mark.parametrize('name', sorted(RUNTIMES))
def test_f32_is_right_at_every_size_from_one_file(tiny_export, name):
    part, path = tiny_export
    runtime = get_runtime(name)
    assert runtime.available() is None and 'f32' in runtime.precisions()
    run = runtime.load(path, 'f32', threads=1)
    records = verify(run, part, [torch.randn(*s) for s in SIZES])
    assert [r['shape'] for r in records] == [list(s) for s in SIZES]
    for record in records:
        assert len(record['max_abs_diff']) == 2 and max(record['max_abs_diff']) <= 1e-4, record


def test_onnxruntime_names_the_runtime_for_reduced_precision(tiny_export):
    with pytest.raises(ValueError, match="onnxruntime runs f32 on this CPU, not 'int8' "
                                         r'\(reduced precisions: use --runtime openvino\)'):
        get_runtime('onnxruntime').load(tiny_export[1], 'int8', calibration=[])


def test_openvino_lists_bf16_exactly_where_the_cpu_plugin_has_it():
    caps = ovd.cpu_capabilities()
    assert 'FP32' in caps
    assert ('bf16' in get_runtime('openvino').precisions()) == ('BF16' in caps)


def test_openvino_keeps_batch_height_and_width_dynamic(tiny_export):
    assert ovd.dynamic_dims(ovd.read_onnx(tiny_export[1])) == ['[?,3,?,?]']


def test_openvino_cannot_take_a_broken_file_and_says_so_in_one_line(tmp_path):
    bad = tmp_path / 'bad.onnx'
    bad.write_bytes(b'not an onnx file')
    with pytest.raises(ValueError, match=r'^OpenVINO cannot convert .*bad\.onnx: ') as err:
        ovd.read_onnx(str(bad))
    assert '\n' not in str(err.value)


def test_int8_needs_calibration(tiny_export):
    with pytest.raises(ValueError, match='int8 needs calibration images'):
        get_runtime('openvino').load(tiny_export[1], 'int8')


def test_int8_quantizes_and_stays_close(tiny_export):
    part, path = tiny_export
    torch.manual_seed(1)
    calibration = [torch.randn(1, 3, 64, 96).numpy() for _ in range(4)]
    quantized = ovd.quantize_int8(ovd.read_onnx(path), calibration)
    fake_quantize = [op for op in quantized.get_ops() if op.get_type_name() == 'FakeQuantize']
    assert len(fake_quantize) >= 8  # the linear layers' inputs and weights, at least
    run = get_runtime('openvino').load(path, 'int8', threads=1, calibration=calibration)
    x = torch.randn(2, 3, 80, 112)  # another batch and size than the calibration's
    with torch.no_grad():
        expected = [e.numpy().ravel() for e in part(x)]
    got = [g.ravel() for g in run(x.numpy())]
    for g, e in zip(got, expected):
        cosine = float(g @ e / np.linalg.norm(g) / np.linalg.norm(e))
        assert cosine >= 0.98, cosine  # quantized, so not equal ...
        assert np.abs(g - e).max() > 1e-4  # ... and not f32 in disguise


def test_a_fixed_size_file_at_another_size_is_a_one_line_error(tmp_path):
    part = ExportPart(tiny_backbone(7, False, stages=2), 'backbone').eval()
    path = str(tmp_path / 'fixed.onnx')
    export_onnx(part, torch.randn(1, 3, 32, 48), path, DEFAULT_EXPORTER, dynamic_hw=False)
    run = get_runtime('openvino').load(path)
    assert len(run(np.zeros((2, 3, 32, 48), np.float32))) == 2  # the batch stays dynamic
    with pytest.raises(ValueError, match=r'^OpenVINO cannot run input \[1, 3, 40, 48\]: ') as err:
        run(np.zeros((1, 3, 40, 48), np.float32))
    assert '\n' not in str(err.value)
