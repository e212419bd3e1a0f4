"""Complexity counts against the reference table, closed forms and the published figures."""
import importlib.util
import json
import pathlib

import pytest
import torch
from mmengine.analysis import FlopAnalyzer

from swin_rpe_plugin import SwinTransformer
from swin_rpe_plugin.analysis import (attention_table, build_classifier, count_complexity,
                                      msa_flops, wmsa_flops)

TOOL = pathlib.Path(__file__).resolve().parents[2] / 'tools' / 'complexity.py'
TINY = dict(embed_dims=16, depths=(2, 2), num_heads=(1, 2), strides=(4, 2), out_indices=(0, 1),
            drop_path_rate=0.)


def test_reference_table_reproduced(reference):
    example = reference['complexity']['example']
    assert example['unit'] == 'millions of multiply-adds'
    windows = [int(m) for m in example['W-MSA']]
    table = attention_table(example['h'], example['w'], example['C'], windows)
    # The reference prints 4 decimals of millions: the integers must round to exactly those.
    assert round(table['msa_flops'] / 1e6, 4) == example['MSA']
    assert {m: round(v / 1e6, 4) for m, v in table['wmsa_flops'].items()} == example['W-MSA']


def test_formulas_count_each_product():
    # Brute force: qkv (3 hw C^2) + proj (hw C^2), then q@k^T and attn@v over the key set.
    h, w, c, m = 6, 10, 8, (2, 5)
    keys_global, keys_window = h * w, m[0] * m[1]
    linear = 3 * h * w * c * c + h * w * c * c
    assert msa_flops(h, w, c) == linear + 2 * h * w * keys_global * c
    assert wmsa_flops(h, w, c, m) == linear + 2 * h * w * keys_window * c
    with pytest.raises(ValueError, match='c must be a positive int'):
        msa_flops(4, 4, 0)


@pytest.mark.needs('TRACED_SDPA_EXPORTS')  # torch 2.1 traces attention as explicit products
@pytest.mark.parametrize('window, hw', [(7, (97, 131)), ((5, 3), (64, 48))])
def test_sdpa_handle_matches_explicit_path_and_formula(window, hw):
    inputs = (torch.randn(1, 3, *hw),)
    counts = {}
    for fused in (True, False):
        model = SwinTransformer(**TINY, window_size=window, fused_attention=fused).eval()
        counts[fused] = count_complexity(model, inputs, model, '', hw)
    fused, explicit = counts[True], counts[False]
    assert fused['flops'] == explicit['flops']
    assert fused['backbone'] == explicit['backbone']
    assert 'scaled_dot_product_attention' in fused['by_operator']
    # mmengine alone (no handle) skips the fused attention: the handle is what adds it.
    model = SwinTransformer(**TINY, window_size=window, fused_attention=True).eval()
    plain = FlopAnalyzer(model, inputs)
    plain.unsupported_ops_warnings(False)
    attention = sum(row['attention'] for row in fused['backbone'].values())
    assert plain.total() == fused['flops'] - attention > 0
    # Attention part per stage against an independent closed form on the padded grid.
    mh, mw = (window, window) if isinstance(window, int) else window
    h, w = -(-hw[0] // 4), -(-hw[1] // 4)
    for i, c in enumerate((16, 32)):
        hp, wp = -(-h // mh) * mh, -(-w // mw) * mw
        row = fused['backbone'][f'stages.{i}']
        assert row['attention'] == row['attention_formula'] == 2 * (2 * mh * mw * hp * wp * c)
        # linear: qkv on padded tokens; proj (after the scatter back to the map drops the
        # padding) and FFN (ratio 4) on real ones; 2x2 merge (stage 0)
        merge = -(-h // 2) * -(-w // 2) * 4 * c * 2 * c if i == 0 else 0
        assert row['linear'] == 2 * (3 * hp * wp * c * c + 9 * h * w * c * c) + merge
        h, w = -(-h // 2), -(-w // 2)


def _swin_cls_params(embed_dims, depths, num_heads, window=7, classes=1000):
    """Closed-form parameter count of the paper's classifier (independent of the model code)."""
    c = embed_dims
    total = 3 * c * 16 + c + 2 * c  # patch conv 4x4 (+bias) and its norm
    for i, (depth, heads) in enumerate(zip(depths, num_heads)):
        d = c * 2 ** i
        # norm1 2d, qkv 3d^2+3d, proj d^2+d, table, norm2 2d, fc1 4d^2+4d, fc2 4d^2+d
        total += depth * (12 * d * d + 13 * d + (2 * window - 1) ** 2 * heads)
        if i < len(depths) - 1:
            total += 8 * d + 8 * d * d  # merging norm (4d) and reduction 4d -> 2d
    d = c * 2 ** (len(depths) - 1)
    return total + 2 * d + d * classes + classes  # final norm, head


@pytest.mark.parametrize('name, arch', [('Swin-T', 'tiny'), ('Swin-S', 'small'),
                                        ('Swin-B', 'base')])
def test_published_classification_figures(reference, name, arch):
    published = reference['model_variants'][name]
    model = build_classifier(arch)
    result = count_complexity(model, (torch.zeros(1, 3, 224, 224),), model.backbone,
                              'backbone.', (224, 224))
    assert result['params'] == _swin_cls_params(published['embed_dims'], published['depths'],
                                                published['num_heads'])
    # Published params are whole millions: 28.29 M is printed "28" (+1.03%), so the check is
    # 1% or the printed precision (half a million), whichever is wider.
    params_m = published['params_M_cls']
    assert abs(result['params'] / 1e6 - params_m) <= max(0.01 * params_m, 0.5)
    assert round(result['params'] / 1e6) == params_m
    assert abs(result['flops'] / 1e9 / published['GFLOPs_224'] - 1) <= 0.02


def test_cli_json(tmp_path, reference):
    spec = importlib.util.spec_from_file_location('complexity_tool', TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    main = tool.main
    path = tmp_path / 'c.json'
    main(['--feature', '112', '112', '128', '--windows', '1', '7', '--json', str(path)])
    data = json.loads(path.read_text())
    example = reference['complexity']['example']
    assert round(data['msa_flops'] / 1e6, 4) == example['MSA']
    assert round(data['wmsa_flops']['7'] / 1e6, 4) == example['W-MSA']['7']
    path = tmp_path / 'a.json'
    main(['--arch', 'tiny', '--shape', '224', '224', '--json', str(path)])
    data = json.loads(path.read_text())
    assert set(data) >= {'params', 'flops', 'backbone'}
    assert abs(data['flops'] / 1e9 / reference['model_variants']['Swin-T']['GFLOPs_224'] - 1) \
        <= 0.02
