"""Every tool: a misspelt option, a missing file or a bad value is one line, exit code 2."""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from swin_rpe_plugin.cli import ArgumentParser
from swin_rpe_plugin.engine import ConfigArgumentError, MissingPathError, load_config
from swin_rpe_plugin.engine.config import check_backbone_arguments, check_pretrained_paths

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEG = os.path.join(ROOT, 'configs/synthetic/upernet_swin-rpe-tiny_shapes-128x128.py')
DET = os.path.join(ROOT, 'configs/synthetic/mask-rcnn_swin-rpe-tiny_fpn_shapes.py')


def load_tool(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, 'tools', name + '.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_line_exit_2(capsys, fn):
    with pytest.raises(SystemExit) as exit_info:
        fn()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize('name, argv, wrong, meant', [
    ('train', [SEG, '--wrok-dir', 'w'], '--wrok-dir', '--work-dir'),
    ('test', [SEG, 'c.pth', '--show-dri', 'p'], '--show-dri', '--show-dir'),
    ('benchmark', ['--quik'], '--quik', '--quick'),
    ('complexity', ['--arch', 'tiny', '--windw-size', '7'], '--windw-size', '--window-size'),
    ('convert_checkpoint', ['a.pth', 'b.pth', '--windw', '7'], '--windw', '--window'),
    ('visualize_rpe', ['--chekpoint', 'x.pth'], '--chekpoint', '--checkpoint'),
    ('demo', ['--no-benchmrk'], '--no-benchmrk', '--no-benchmark'),
    ('make_synthetic_data', ['--num-tran', '3'], '--num-tran', '--num-train'),
])
def test_misspelt_option_suggests_the_one_meant(capsys, name, argv, wrong, meant):
    module = load_tool(name)
    parse = getattr(module, 'parse_args', None) or module.main  # demo parses inside main
    line = one_line_exit_2(capsys, lambda: parse(argv))
    assert f'unrecognized arguments: {wrong}' in line
    assert f'did you mean: {wrong} -> {meant}?' in line


def test_invalid_choice_suggests_the_close_one(capsys):
    line = one_line_exit_2(capsys, lambda: load_tool('complexity').parse_args(['--arch', 'tinny']))
    assert "invalid choice: 'tinny'" in line and "(did you mean 'tiny'?)" in line


def test_parser_leaves_unrelated_words_without_suggestion(capsys):
    parser = ArgumentParser(prog='p')
    parser.add_argument('--alpha')
    line = one_line_exit_2(capsys, lambda: parser.parse_args(['--zzzzzz']))
    assert line == 'p: error: unrecognized arguments: --zzzzzz; see --help'


def test_misspelt_backbone_argument_suggests_the_close_one():
    cfg = load_config(SEG, {'model.backbone.windw_size': 7})
    with pytest.raises(ConfigArgumentError, match=r"takes no argument 'windw_size' \(did you "
                       r"mean 'window_size'\?\)"):
        check_backbone_arguments(cfg)


def test_missing_pretrained_file_names_the_config_key(tmp_path):
    missing = str(tmp_path / 'swin.pth')
    config = tmp_path / 'pretrained.py'  # what a user writes: the recipe plus init_cfg
    config.write_text(f"_base_ = [{DET!r}]\nmodel = dict(backbone=dict(init_cfg=dict("
                      f"_delete_=True, type='Pretrained', checkpoint={missing!r})))\n")
    with pytest.raises(MissingPathError, match=r"model\.backbone\.init_cfg\.checkpoint: "
                       r"checkpoint not found: '.*swin\.pth'"):
        check_pretrained_paths(load_config(str(config)))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    data = str(tmp_path / 'data')
    from swin_rpe_plugin.datasets import make_synthetic_data
    make_synthetic_data(data, num_train=1, num_val=1, seed=0, progress=False)
    proc = subprocess.run(
        [sys.executable, 'tools/train.py', str(config), '--work-dir', str(tmp_path / 'w'),
         '--data-root', os.path.join(data, 'coco')],
        cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"error: model.backbone.init_cfg.checkpoint: checkpoint not found: '{missing}'")
    assert 'Traceback' not in proc.stderr and not proc.stdout.strip()


def test_visualize_rpe_missing_checkpoint_is_one_line(capsys, tmp_path):
    line = one_line_exit_2(capsys, lambda: load_tool('visualize_rpe').main(
        ['--checkpoint', str(tmp_path / 'none.pth'), '--out', str(tmp_path)]))
    assert line == f"error: --checkpoint: checkpoint not found: '{tmp_path / 'none.pth'}'"


def test_complexity_missing_config_is_one_line(capsys, tmp_path):
    line = one_line_exit_2(capsys, lambda: load_tool('complexity').main(
        ['--config', str(tmp_path / 'none.py'), '--shape', '64', '64']))
    assert line == f"error: --config: config file not found: '{tmp_path / 'none.py'}'"


def test_all_zero_tables_are_named_in_report_and_pictures(tmp_path):
    from mmdet.models.backbones import SwinTransformer as MMDetSwin
    from swin_rpe_plugin import SwinTransformer
    from swin_rpe_plugin.analysis import rpe_plots
    from swin_rpe_plugin.checkpoint import load_pretrained
    kwargs = dict(embed_dims=16, depths=(2, 2), num_heads=(1, 2), strides=(4, 2),
                  out_indices=(0, 1), window_size=3)
    stock = MMDetSwin(**kwargs)  # mmdet never initialises the tables: all zero
    assert all(not p.any() for n, p in stock.named_parameters()
               if n.endswith('relative_position_bias_table'))
    path = str(tmp_path / 'mmdet.pth')
    torch.save({'state_dict': stock.state_dict()}, path)
    ours = SwinTransformer(**kwargs)
    report = load_pretrained(ours, path)
    assert len(report.zero_tables) == 4
    assert 'all-zero relative_position_bias_table: 4' in report.summary()
    fig = rpe_plots.plot_bias_tables(ours, 0, str(tmp_path / 't.png'))
    assert 'ALL ZERO' in fig._suptitle.get_text()
    rpe_plots.close(fig)
    ours.init_weights()  # a fresh model's tables are not zero: nothing is named
    fig = rpe_plots.plot_bias_tables(ours, 0, str(tmp_path / 'f.png'))
    assert 'ALL ZERO' not in fig._suptitle.get_text()
    rpe_plots.close(fig)
    assert not load_pretrained(SwinTransformer(**kwargs), _saved(ours, tmp_path)).zero_tables


def _saved(model, tmp_path):
    path = str(tmp_path / 'fresh.pth')
    torch.save({'state_dict': model.state_dict()}, path)
    return path


def test_all_zero_tables_are_named_when_a_state_dict_loads(tmp_path):
    from mmdet.models.backbones import SwinTransformer as MMDetSwin
    from mmengine.logging import MMLogger
    from swin_rpe_plugin import SwinTransformer
    import logging
    kwargs = dict(embed_dims=16, depths=(2, 2), num_heads=(1, 2), strides=(4, 2),
                  out_indices=(0, 1), window_size=3)
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        SwinTransformer(**kwargs).load_state_dict(MMDetSwin(**kwargs).state_dict())
        fresh = SwinTransformer(**kwargs)
        fresh.init_weights()
        SwinTransformer(**kwargs).load_state_dict(fresh.state_dict())
    finally:
        logger.removeHandler(handler)
    zero = [m for m in messages if 'all zero' in m]
    assert zero == ['backbone: 4 of 4 relative_position_bias_tables in the state dict are all '
                    'zero (first: stages.0.blocks.0.attn.w_msa.relative_position_bias_table): '
                    'never initialised or trained (mmdet and mmseg leave them at zero)']


BAD_CHILD = """_base_ = [{base!r}]
model = dict(pretrained=dict(type='Pretrained'))  # the base has pretrained=None
"""


@pytest.mark.parametrize('name', ['train', 'test', 'complexity'])
def test_config_that_cannot_merge_is_one_line_naming_the_key(capsys, tmp_path, name):
    """A child config setting a dict where its base has None (no ``_delete_=True``): mmengine
    raises a multi-line TypeError; every tool turns it into one line with the fix, exit 2."""
    config = tmp_path / 'child.py'
    config.write_text(BAD_CHILD.format(base=SEG))
    torch.save({}, tmp_path / 'c.pth')  # so the config is what is wrong
    argv = {'train': [str(config), '--work-dir', str(tmp_path / 'w')],
            'test': [str(config), str(tmp_path / 'c.pth')],
            'complexity': ['--config', str(config), '--shape', '64', '64']}[name]
    module = load_tool(name)

    def run():
        code = module.main(argv)
        if code:
            sys.exit(code)
    line = one_line_exit_2(capsys, run)
    assert 'pretrained=' in line and 'cannot inherit from base' in line, line
    assert '_delete_=True' in line and str(config) in line, line


def test_config_syntax_error_names_the_line(tmp_path):
    config = tmp_path / 'broken.py'
    config.write_text(f"_base_ = [{SEG!r}]\nmodel = dict(\n")
    proc = subprocess.run([sys.executable, 'tools/train.py', str(config)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and 'line 2' in lines[0] and 'SyntaxError' in lines[0], lines
