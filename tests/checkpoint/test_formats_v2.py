"""SwinV2 checkpoint layouts without a fixture of their own (official SwinV2, mmpretrain, whole
models under a prefix, our converted files) load to the same outputs as the library fixtures.

The layouts are written here from the timm / transformers fixture weights by hand (renames,
merging moved between stages, the official -> nn.Unfold column order), independently of the
rules in ``checkpoint/formats.py``.
"""
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from swin_rpe_plugin import SwinTransformerV2
from swin_rpe_plugin.checkpoint import load_pretrained
from swin_rpe_plugin.checkpoint.loader import convert_file
from conftest import ROOT

FIXTURES = os.path.join(ROOT, 'tests', 'fixtures', 'swinv2')
TINY = dict(embed_dims=8, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8), drop_path_rate=0.0)


def outputs(path, window, pretrained=0, hw=(256, 256), **kwargs):
    torch.manual_seed(1)  # same output norms for every load
    model = SwinTransformerV2(**TINY, window_size=window, pretrained_window_size=pretrained)
    report = load_pretrained(model, path, **kwargs)
    image = load_file(os.path.join(FIXTURES, 'input.safetensors'))['input']
    with torch.no_grad():
        return model.eval()(image[:, :, :hw[0], :hw[1]].float()), report


def official_to_unfold_columns(weight):
    """[out, 4C] official concat (x00 | x10 | x01 | x11) -> nn.Unfold order (c, ky, kx)."""
    c = weight.shape[1] // 4
    block = {(0, 0): 0, (1, 0): 1, (0, 1): 2, (1, 1): 3}
    order = [block[(ky, kx)] * c + ch for ch in range(c) for ky in (0, 1) for kx in (0, 1)]
    return weight[:, order]


def timm_as_official(timm):
    out = {}
    for k, v in timm.items():
        parts = k.split('.')
        if parts[0] == 'layers' and parts[2] == 'downsample':  # start of i -> end of i - 1
            k = '.'.join(['layers', str(int(parts[1]) - 1)] + parts[2:])
        out[k] = v
        if k.endswith('attn.logit_scale'):  # the official code saves these buffers too
            out[k.replace('logit_scale', 'relative_position_index')] = torch.zeros(16, 16).long()
            out[k.replace('logit_scale', 'relative_coords_table')] = torch.zeros(1, 7, 7, 2)
    return out


def timm_as_mmpretrain(timm):
    out = {}
    for k, v in timm.items():
        k = k.replace('patch_embed.proj.', 'patch_embed.projection.')
        k = k.replace('mlp.fc1.', 'ffn.layers.0.0.').replace('mlp.fc2.', 'ffn.layers.1.')
        if k.startswith('layers.'):
            k = 'stages.' + k[len('layers.'):]
            for name in ('qkv', 'q_bias', 'v_bias', 'logit_scale', 'cpb_mlp', 'proj'):
                k = k.replace(f'.attn.{name}', f'.attn.w_msa.{name}')
            if k.endswith('downsample.reduction.weight'):
                v = official_to_unfold_columns(v)
        elif k.startswith('head.'):
            out['head.fc.' + k.split('.')[-1]] = v
            continue
        elif k.startswith('norm.'):
            k = 'norm3.' + k.split('.')[-1]  # mmpretrain: out_indices=(3,) with its norm3
        out['backbone.' + k] = v
    return out


@pytest.mark.parametrize('layout,fmt', [(timm_as_official, 'official_v2'),
                                        (timm_as_mmpretrain, 'mmpretrain_v2')])
def test_official_and_mmpretrain_layouts_match_timm(tmp_path, layout, fmt):
    timm_path = os.path.join(FIXTURES, 'timm_weights.safetensors')
    path = str(tmp_path / f'{fmt}.pth')
    torch.save({'state_dict': layout(load_file(timm_path))}, path)
    ref, _ = outputs(timm_path, 6, 4, (384, 384))
    outs, report = outputs(path, 6, 4, (384, 384), strict=False)
    assert report.format == fmt and not report.unexpected
    # a classifier's mmpretrain checkpoint has the last output norm only
    assert set(report.missing) == (set() if fmt == 'official_v2' else {
        f'norm{i}.{p}' for i in range(3) for p in ('weight', 'bias')})
    for a, b in zip(outs, ref):
        if fmt == 'official_v2' or a is not outs[3]:
            assert torch.allclose(a, b, atol=1e-6)
    if fmt == 'mmpretrain_v2':  # its norm3 is an output norm: loaded, so stage 3 changes
        assert 'norm3.weight' in report.loaded


def test_transformers_classifier_and_detector_wrappers(tmp_path):
    hf_path = os.path.join(FIXTURES, 'hf_weights.safetensors')
    hf = load_file(hf_path)
    ref, _ = outputs(hf_path, 8)
    classifier = {f'swinv2.{k}': v for k, v in hf.items()}
    classifier.update({'classifier.weight': torch.zeros(10, 64), 'classifier.bias':
                       torch.zeros(10)})
    save_file(classifier, str(tmp_path / 'cls.safetensors'))
    outs, report = outputs(str(tmp_path / 'cls.safetensors'), 8)
    assert report.format == 'transformers_v2' and 'classifier.weight' in report.ignored
    assert all(torch.equal(a, b) for a, b in zip(outs, ref))
    # our converted file, then wrapped as an mmdet detector's state dict
    convert_file(hf_path, str(tmp_path / 'ours.pth'), log=False)
    ours = torch.load(str(tmp_path / 'ours.pth'), weights_only=True)['state_dict']
    detector = {f'backbone.{k}': v for k, v in ours.items()}
    detector['neck.lateral_convs.0.conv.weight'] = torch.zeros(1)
    torch.save({'state_dict': detector, 'meta': {}}, str(tmp_path / 'det.pth'))
    outs, report = outputs(str(tmp_path / 'det.pth'), 8)
    assert report.format == 'swinv2' and not report.converted  # our names: nothing renamed
    assert all(torch.equal(a, b) for a, b in zip(outs, ref))
