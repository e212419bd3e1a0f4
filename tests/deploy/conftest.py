"""A tiny Swin backbone with random weights and its dynamic ONNX export, shared by the runtime
tests (exported once per session: the classic exporter takes a few seconds)."""
import pytest
import torch

from swin_rpe_plugin import SwinTransformer
from swin_rpe_plugin.deploy import ExportPart, export_onnx

TINY_EXPORT_SIZE = (1, 3, 64, 96)


def tiny_swin(window=7, mask_padding=False, stages=4, embed_dims=16):
    torch.manual_seed(0)
    model = SwinTransformer(embed_dims=embed_dims, depths=(2,) * stages,
                            num_heads=(1, 1, 2, 2)[:stages], strides=(4,) + (2,) * (stages - 1),
                            out_indices=tuple(range(stages)), window_size=window,
                            mask_padding=mask_padding, drop_path_rate=0.0)
    model.init_weights()
    with torch.no_grad():  # tables that matter, so a wrong index or mask shows
        for name, p in model.named_parameters():
            if 'relative_position_bias_table' in name:
                p.normal_(0, 1.0)
    return model.eval()


@pytest.fixture(scope='session')
def tiny_export(tmp_path_factory):
    """(ExportPart of a tiny 2-stage backbone, path of its dynamic ONNX export)."""
    part = ExportPart(tiny_swin(stages=2, embed_dims=32), 'backbone').eval()
    path = str(tmp_path_factory.mktemp('tiny') / 'tiny_backbone.onnx')
    example = torch.randn(*TINY_EXPORT_SIZE)
    export_onnx(part, example, path, 'classic', output_names=part.output_names(example))
    return part, path
