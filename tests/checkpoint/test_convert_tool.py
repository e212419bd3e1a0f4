"""tools/convert_checkpoint.py: convert + resize on the way, .pth/.safetensors, exit codes."""
import importlib.util
import os

import pytest
import torch
from safetensors.torch import load_file

from swin_rpe_plugin import SwinTransformer
from swin_rpe_plugin.checkpoint import load_pretrained
from conftest import ROOT

FIXTURES = os.path.join(ROOT, 'tests', 'fixtures', 'swin')


def tool():
    spec = importlib.util.spec_from_file_location(
        'convert_checkpoint', os.path.join(ROOT, 'tools', 'convert_checkpoint.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny(window):  # the configuration of the committed fixtures
    return SwinTransformer(embed_dims=8, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8),
                           window_size=window, drop_path_rate=0.0).eval()


@pytest.mark.parametrize('dst', ['out.safetensors', 'out.pth'])
def test_converted_file_loads_as_mmdet_and_equals_direct_load(tmp_path, capsys, dst):
    src = os.path.join(FIXTURES, 'hf_tiny_hf', 'model.safetensors')
    out = str(tmp_path / dst)
    assert tool().main([src, out, '--window', '12']) == 0
    printed = capsys.readouterr().out
    assert 'format transformers' in printed and 'resized 8' in printed
    direct, converted = tiny(12), tiny(12)
    load_pretrained(direct, src)  # resized at load time
    report = load_pretrained(converted, out)
    assert report.format == 'mmdet' and not report.converted and not report.resized
    for key, value in direct.state_dict().items():
        if not key.startswith('norm'):
            assert torch.equal(value, converted.state_dict()[key]), key
    if dst.endswith('.safetensors'):
        assert set(load_file(out)) == {k for k in direct.state_dict() if not k.startswith('norm')}


def test_img_size_resizes_absolute_position_embedding(tmp_path):
    source = SwinTransformer(embed_dims=16, depths=(1, 1), num_heads=(1, 2), strides=(4, 2),
                             out_indices=(0, 1), use_abs_pos_embed=True, pretrain_img_size=224)
    source.init_weights()
    src = str(tmp_path / 'src.pth')
    torch.save({'state_dict': source.state_dict()}, src)
    out = str(tmp_path / 'out.pth')
    assert tool().main([src, out, '--img-size', '384', '--mode', 'bilinear']) == 0
    embed = torch.load(out, weights_only=True)['state_dict']['absolute_pos_embed']
    ref = torch.nn.functional.interpolate(
        source.absolute_pos_embed.reshape(1, 56, 56, 16).permute(0, 3, 1, 2), size=(96, 96),
        mode='bilinear', align_corners=False).flatten(2).transpose(1, 2)
    assert torch.allclose(embed, ref, atol=1e-6)


class Payload:
    def __reduce__(self):
        return (print, ('code ran',))


def test_unrecognised_or_unsafe_source_exits_non_zero(tmp_path, capsys):
    unknown = str(tmp_path / 'unknown.pth')
    torch.save({'fc.weight': torch.zeros(1)}, unknown)
    assert tool().main([unknown, str(tmp_path / 'a.pth')]) == 2
    assert 'unrecognised Swin checkpoint layout' in capsys.readouterr().err
    unsafe = str(tmp_path / 'unsafe.pth')
    torch.save({'state_dict': {'x': torch.zeros(1)}, 'p': Payload()}, unsafe)
    assert tool().main([unsafe, str(tmp_path / 'b.pth')]) == 2
    captured = capsys.readouterr()
    assert '--allow-pickle' in captured.err and 'code ran' not in captured.out
    assert not os.path.exists(tmp_path / 'a.pth') and not os.path.exists(tmp_path / 'b.pth')
