"""complexity.py prints published figures only next to the recipe and size they belong to."""
import importlib.util
import os

from swin_rpe_plugin.analysis.models import PUBLISHED_CONFIGS, published_for_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SYNTHETIC = os.path.join(ROOT, 'configs/synthetic/upernet_swin-rpe-tiny_shapes-128x128.py')
MASK_RCNN = os.path.join(ROOT, 'configs/swin_rpe/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py')


def test_only_configs_with_published_figures_get_them():
    assert all(os.path.isfile(os.path.join(ROOT, 'configs/swin_rpe', name))
               for name in PUBLISHED_CONFIGS)
    assert published_for_config(SYNTHETIC, (128, 128)) == ''
    text = published_for_config(MASK_RCNN, (800, 1280))
    assert text.startswith('Published (Mask R-CNN Swin-T, 800x1280;')
    assert 'not measured here' in text
    assert '48 M params, 267 G FLOPs' in text
    other_size = published_for_config(MASK_RCNN, (512, 512))
    assert 'not shown at 512x512' in other_size and '267' not in other_size


def test_tool_prints_no_published_table_for_the_synthetic_config(capsys):
    spec = importlib.util.spec_from_file_location('complexity', os.path.join(ROOT, 'tools',
                                                                             'complexity.py'))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    tool.main(['--config', SYNTHETIC, '--shape', '128', '128'])
    out = capsys.readouterr().out
    assert 'G FLOPs' in out and 'ublished' not in out
    tool.main(['--arch', 'tiny', '--window-size', '12'])
    assert 'ublished' not in capsys.readouterr().out  # the paper's figures are for window 7
