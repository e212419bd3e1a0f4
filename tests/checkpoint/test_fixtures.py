"""Checkpoints saved by timm 1.0, torchvision 0.28 and transformers 5.x load through our loader
and reproduce those libraries' own stage outputs (the committed fixtures of ``tests/fixtures/swin``,
made by ``tests/fixtures/make_swin_fixtures.py``; see the README there).

The fixtures' stage tensors are taken before any norm; ours pass through mmdet's per-output
``norm0..3``, so the test applies those same norm parameters to the fixture tensors.
"""
import functools
import json
import os

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from swin_rpe_plugin import SwinTransformer
from swin_rpe_plugin.checkpoint import convert_checkpoint, load_pretrained
from conftest import ROOT

FIXTURES = os.path.join(ROOT, 'tests', 'fixtures', 'swin')
WEIGHTS = {'timm': '{lib}_{cfg}.safetensors', 'torchvision': '{lib}_{cfg}.safetensors',
           'hf': 'hf_{cfg}_hf/model.safetensors'}
CONFIGS = {'tiny': (7, 224), 'tiny_w12': (12, 384)}
ODD_HW = (97, 131)


def tiny_swin(window: int, img: int = 224) -> SwinTransformer:
    return SwinTransformer(pretrain_img_size=img, embed_dims=8, depths=(2, 2, 2, 2),
                           num_heads=(1, 2, 4, 8), window_size=window, drop_path_rate=0.0).eval()


def with_random_output_norms(model: SwinTransformer) -> SwinTransformer:
    with torch.no_grad():
        for i in range(4):
            norm = getattr(model, f'norm{i}')
            norm.weight.normal_(1, 0.2)
            norm.bias.normal_(0, 0.1)
    return model


def output_norm(model: SwinTransformer, i: int, t: torch.Tensor) -> torch.Tensor:
    """Apply our norm{i} to an NCHW fixture tensor."""
    norm = getattr(model, f'norm{i}')
    x = F.layer_norm(t.permute(0, 2, 3, 1), t.shape[1:2], norm.weight, norm.bias, norm.eps)
    return x.permute(0, 3, 1, 2)


def loaded(lib: str, cfg: str):
    window, img = CONFIGS[cfg]
    model = with_random_output_norms(tiny_swin(window, img))
    report = load_pretrained(model, os.path.join(FIXTURES, WEIGHTS[lib].format(lib=lib, cfg=cfg)),
                             strict=True)
    io = load_file(os.path.join(FIXTURES, f'{lib}_{cfg}_io.safetensors'))
    # One stored input (float16-exact); each case is its top-left crop (see the README).
    image = load_file(os.path.join(FIXTURES, 'input.safetensors'))['input'].float()
    io['input'] = image[:, :, :img, :img].contiguous()
    io['odd_input'] = image[:, :, :ODD_HW[0], :ODD_HW[1]].contiguous()
    return model, report, io


def max_diff(model, outs, io, names):
    diffs = {}
    for i, name in names.items():
        ref = output_norm(model, i, io[name])
        assert outs[i].shape == ref.shape, name
        diffs[name] = (outs[i] - ref).abs().max().item()
    return diffs


@pytest.mark.parametrize('cfg', list(CONFIGS))
@pytest.mark.parametrize('lib,fmt', [('timm', 'timm'), ('torchvision', 'torchvision'),
                                     ('hf', 'transformers')])
def test_library_checkpoint_reproduces_stage_outputs(lib, fmt, cfg):
    model, report, io = loaded(lib, cfg)
    assert report.format == fmt
    assert not report.missing and not report.unexpected and not report.resized
    assert len(report.loaded) == len(model.state_dict()) - 8  # all but norm0..3
    assert len(report.not_in_format) == 8  # none of these libraries saves output norms
    with torch.no_grad():
        outs = model(io['input'])
    # Stage 3 is a single window: ours shifts it (detection semantics), as HF always_partition.
    names = {0: 'stage0', 1: 'stage1', 2: 'stage2'}
    if lib == 'hf':
        names[3] = 'ap_stage3'
    diffs = max_diff(model, outs, io, names)
    assert max(diffs.values()) < 1e-4, diffs
    if lib != 'hf':  # and so differs from the classification libraries' unshifted stage 3
        assert (outs[3] - output_norm(model, 3, io['stage3'])).abs().max() > 1e-2


@pytest.mark.parametrize('lib', ['timm', 'torchvision'])
def test_stage3_matches_when_its_shift_is_removed(lib):
    # Checks the last stage's weights too: without the shift our stage 3 is the library's.
    model, _, io = loaded(lib, 'tiny')
    for block in model.stages[3].blocks:
        block.shift_size = block.attn.shift_size = (0, 0)
    with torch.no_grad():
        outs = model(io['input'])
    assert max_diff(model, outs, io, {3: 'stage3'})['stage3'] < 1e-4


def test_hf_odd_size_matches_always_partition():
    model, _, io = loaded('hf', 'tiny')
    with torch.no_grad():
        outs = model(io['odd_input'])
    diffs = max_diff(model, outs, io, {i: f'odd_ap_stage{i}' for i in range(4)})
    assert max(diffs.values()) < 1e-4, diffs


def test_odd_sizes_of_timm_and_torchvision_differ_by_design():
    """What the README tells users: timm rolls before padding, torchvision truncates."""
    model, _, io = loaded('timm', 'tiny')
    with torch.no_grad():
        outs = model(io['odd_input'])
    assert outs[0].shape == io['odd_stage0'].shape  # same grid (both pad) ...
    assert (outs[0] - output_norm(model, 0, io['odd_stage0'])).abs().max() > 1e-2  # other values
    model, _, io = loaded('torchvision', 'tiny')
    with torch.no_grad():
        outs = model(io['odd_input'])
    assert outs[0].shape[-2:] == (25, 33) and io['odd_stage0'].shape[-2:] == (24, 32)
    with torch.no_grad():  # cropping the image to a multiple of the patch gives its stage 0, 1
        outs = model(io['odd_input'][:, :, :96, :128])
    diffs = max_diff(model, outs, io, {0: 'odd_stage0', 1: 'odd_stage1'})
    assert max(diffs.values()) < 1e-4, diffs


def _keys_listing(name):
    with open(os.path.join(FIXTURES, name)) as f:
        return json.load(f)


@functools.lru_cache(maxsize=1)
def _swin_t_shapes():
    model = SwinTransformer(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24),
                            window_size=7)
    return {k: v.shape for k, v in model.state_dict().items()}


LISTINGS = [('timm_swin_t_keys.json', None), ('torchvision_swin_t_keys.json', None)] + [
    ('hf_swin_t_keys.json', v) for v in _keys_listing('hf_swin_t_keys.json')['variants']] + [
    ('hf4_swin_t_keys.json', v) for v in _keys_listing('hf4_swin_t_keys.json')['variants']]


@pytest.mark.parametrize('listing,variant', LISTINGS)
def test_full_swin_t_key_listings_map_onto_every_parameter(listing, variant):
    """Each library's full Swin-T key listing (names and shapes) fills all of our Swin-T."""
    entry = _keys_listing(listing)
    entry = entry['variants'][variant] if variant else entry
    state = {k: torch.zeros(shape) for k, shape in entry['state_dict'].items()}
    conversion = convert_checkpoint(state)  # the loader's path from a read dict (no file I/O)
    own = _swin_t_shapes()
    assert not conversion.unexpected
    has_norms = 'SwinBackbone' in (variant or '')
    expected = {k for k in own if has_norms or not k.startswith('norm')}
    assert set(conversion.state) == expected
    assert all(conversion.state[k].shape == own[k] for k in expected)
