"""The README: what it is before the commands, and its mmdet and mmseg snippets build."""
import os
import re

import pytest
import torch
from mmengine.config import Config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, 'README.md')).read()
BLOCK = re.compile(r'^## (?P<title>[^\n]+)\n(?P<body>.*?)(?=^## |\Z)', re.S | re.M)
CODE = re.compile(r'^```python\n(?P<code>.*?)^```', re.S | re.M)


def section_code(title: str) -> str:
    sections = {m['title'].strip(): m['body'] for m in BLOCK.finditer(README)}
    assert title in sections, sorted(sections)
    blocks = CODE.findall(sections[title])
    assert len(blocks) == 1, blocks
    return blocks[0]


def test_readme_says_what_it_is_before_the_two_commands():
    lines = README.splitlines()
    assert lines[0] == '# swin_rpe_plugin'
    first_fence = lines.index('```')
    prose = ' '.join(l for l in lines[1:first_fence] if l.strip())
    assert prose.startswith('A Swin Transformer backbone') and prose.count('. ') == 0 \
        and prose.endswith('.')  # one sentence
    assert 'OpenMMLab' in prose and 'mmdet' in prose and 'mmseg' in prose
    assert lines[first_fence + 1:first_fence + 4] == ['make demo', 'make test', '```']


@pytest.mark.parametrize('toolkit, title', [('mmdet', 'Use it in an mmdet config'),
                                            ('mmseg', 'Use it in an mmseg config')])
def test_readme_snippet_builds_and_runs(tmp_path, toolkit, title):
    import importlib
    from mmengine.registry import init_default_scope
    from swin_rpe_plugin import SwinTransformer
    code = section_code(title)
    path = tmp_path / 'snippet.py'
    path.write_text(code)
    cfg = Config.fromfile(str(path))
    assert cfg.default_scope == toolkit
    init_default_scope(toolkit)
    model = importlib.import_module(f'{toolkit}.registry').MODELS.build(cfg.model)
    assert type(model.backbone) is SwinTransformer
    # the snippet's init_cfg names the file the README tells the user to provide
    assert cfg.model.backbone.init_cfg.checkpoint == 'checkpoints/swin_tiny.pth'
    model.eval()
    x = torch.zeros(1, 3, 64, 96)
    with torch.no_grad():
        feats = model.extract_feat(x)  # backbone -> neck (mmdet) or backbone (mmseg)
    if toolkit == 'mmdet':
        assert len(feats) == 5 and all(f.shape[1] == 256 for f in feats)
        from mmdet.structures import DetDataSample
        meta = dict(img_shape=(64, 96), ori_shape=(64, 96), pad_shape=(64, 96),
                    batch_input_shape=(64, 96), scale_factor=(1.0, 1.0))
        with torch.no_grad():
            model(x, [DetDataSample(metainfo=meta)], mode='tensor')
    else:
        assert [f.shape[1] for f in feats] == [96, 192, 384, 768]
        with torch.no_grad():
            logits = model.decode_head(feats)
        assert logits.shape[1] == 150
