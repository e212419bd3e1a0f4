"""Every kind of comparison through tools/benchmark.py on tiny shapes: records well formed, the two
sides agree, the report is made from the JSON. No timing is asserted.

SwinV2 runs against transformers' Swinv2Model, installed by tools/setup_env.sh in a folder of its
own (``<venv>/reference``) and put on PYTHONPATH only for the subprocess that needs it.
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT

pytestmark = pytest.mark.heavy  # minutes: scheduled first (tests/conftest.py)

REFERENCE = os.path.join(sys.prefix, 'reference')  # transformers, by tools/setup_env.sh
CASE = ('kind', 'arch', 'shape', 'batch', 'mode', 'dtype')


def load_tool():
    spec = importlib.util.spec_from_file_location(
        'benchmark_tool', os.path.join(ROOT, 'tools', 'benchmark.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_record(r, baseline, candidate='ours'):
    assert r['baseline'] == baseline and r['candidate'] == candidate
    assert r[f'{baseline}_ms'] > 0 and r[f'{candidate}_ms'] > 0
    assert r['speedup'] == r[f'{baseline}_ms'] / r[f'{candidate}_ms']
    assert r['gflops'] > 0 and r['roof_gflops'] > 0
    assert r['roofline_fraction'] == r['gflops'] / r[f'{candidate}_ms'] * 1e3 / r['roof_gflops']
    assert isinstance(r['flags'], list) and r['cpu'] and r['threads'] >= 1


@pytest.fixture(scope='module')
def backbone_run(tmp_path_factory):
    path = tmp_path_factory.mktemp('bench') / 'bench.json'
    assert load_tool().main(['--shape', '32', '48', '--batch', '1', '--repeats', '1',
                             '--no-compile', '--json', str(path)]) == 0
    with open(path) as f:
        return str(path), json.load(f)


def test_backbone_records_one_per_case_with_memory_and_parity(backbone_run):
    _, run = backbone_run
    records = run['records']
    assert [(r['mode'], r['dtype']) for r in records] == [('infer', 'fp32'), ('train', 'fp32')]
    for r in records:
        assert {k: r[k] for k in CASE} == dict(kind='backbone', arch='tiny', shape=[32, 48],
                                               batch=1, mode=r['mode'], dtype='fp32')
        check_record(r, 'mmdet')
        assert r['max_abs_diff'] < 1e-4 and r['rel_err_vs_fp32'] == 0.0
        assert r['mmdet_peak_mb'] > 0 and r['ours_peak_mb'] > 0
        assert r['mem_ratio'] == r['ours_peak_mb'] / r['mmdet_peak_mb']
    assert run['matmul_gflops']['fp32'] > 0 and run['command'].startswith('tools/benchmark.py')
    assert run['commit'] and run['date']


def test_report_from_a_real_run(backbone_run, tmp_path):
    from benchmarks.report import HEADLINE, class_slug, cpu_class
    path, run = backbone_run
    readme = tmp_path / 'README.md'
    readme.write_text(f'intro\n{HEADLINE[0]}\nold\n{HEADLINE[1]}\nrest\n')
    from benchmarks.report import write_report
    written = write_report([path], str(tmp_path))
    chart = tmp_path / 'docs' / 'images' / f'benchmark_{class_slug(cpu_class(run))}.png'
    assert str(chart) in written and str(readme) in written
    import matplotlib.image
    assert matplotlib.image.imread(str(chart)).ndim == 3
    doc = (tmp_path / 'docs' / 'performance.md').read_text()
    assert f'## {run["cpu"]}' in doc and run['command'] in doc and run['commit'] in doc
    rows = [line for line in doc.splitlines() if line.startswith('| tiny 32x48 b1')]
    assert len(rows) == 2
    for row, r in zip(rows, run['records']):
        assert f"**{r['speedup']:.2f}**" in row.split(' | ')[4] and r['mode'] in row
    text = readme.read_text()
    assert text.startswith('intro\n') and text.endswith('rest\n') and 'old' not in text
    assert text.count(' 32x48 b1 ') == 2  # one line per CPU class, both records on it


def test_report_leaves_a_readme_without_markers_alone(backbone_run, tmp_path):
    from benchmarks.report import write_report
    (tmp_path / 'README.md').write_text('no markers\n')
    written = write_report([backbone_run[0]], str(tmp_path))
    assert (tmp_path / 'README.md').read_text() == 'no markers\n'
    assert not any(p.endswith('README.md') for p in written)


def test_report_refuses_a_file_that_is_not_a_benchmark_json(tmp_path):
    from benchmarks.report import write_report
    bad = tmp_path / 'x.json'
    bad.write_text('{"a": 1}')
    with pytest.raises(ValueError, match='not a tools/benchmark.py --json file'):
        write_report([str(bad)], str(tmp_path))


def test_v2_against_transformers(tmp_path):
    """The crash of issue 19 (`--arch v2-tiny`): run with transformers present. Window 2 at
    96x96: every stage map (24, 12, 6, 3) is larger than the window, so transformers keeps it."""
    assert os.path.isdir(os.path.join(REFERENCE, 'transformers')), \
        f'{REFERENCE} has no transformers: run `make setup` (tools/setup_env.sh installs it)'
    out = tmp_path / 'v2.json'
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, REFERENCE]))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, 'tools', 'benchmark.py'),
                           '--arch', 'v2-tiny', '--shape', '96', '96', '--window', '2',
                           '--batch', '1', '--mode', 'train', '--repeats', '1',
                           '--json', str(out)],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = json.loads(out.read_text())['records']
    assert len(records) == 1
    for r in records:
        assert {k: r[k] for k in CASE} == dict(kind='v2', arch='v2-tiny', shape=[96, 96],
                                               batch=1, mode='train', dtype='fp32')
        check_record(r, 'transformers')
        assert r['max_abs_diff'] < 1e-4 and r['window'] == 2
        assert r['transformers_peak_mb'] > 0 and r['ours_peak_mb'] > 0


def test_v2_work_counts_against_transformers(tmp_path):
    """`--work --arch v2-tiny`: transformers' Swinv2Model is the baseline side of the exact
    counts, beside ours on the CPU path and on the generic path; at 256x256 (every stage map a
    whole number of windows, so no side pads or shrinks one) both of ours multiply the same
    FLOPs, within 1% of transformers', and every ratio is to transformers' side."""
    from benchmarks.format import work_rows
    out = tmp_path / 'v2_work.json'
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, REFERENCE]))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, 'tools', 'benchmark.py'),
                           '--work', '--arch', 'v2-tiny', '--shape', '256', '256', '--mode',
                           'infer', '--dtype', 'fp32', '--json', str(out)],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (record,) = json.loads(out.read_text())['records']
    sides = record['sides']
    assert record['baseline'] == 'transformers'
    assert set(sides) == {'transformers', 'ours', 'ours_generic'}
    flops = {side: sides[side]['product_flops'] for side in sides}
    assert flops['ours'] == flops['ours_generic'] > 0
    assert abs(flops['ours'] / flops['transformers'] - 1) < 0.01
    rows = work_rows(record)
    assert [r['side'] for r in rows] == ['transformers', 'ours', 'ours_generic']
    assert rows[1]['peak_ratio'] == sides['ours']['peak_bytes'] / sides['transformers'][
        'peak_bytes']
    assert rows[0]['peak_ratio'] == 1.0


def built_at_the_tested_size(monkeypatch, shape):
    """mmseg's training preprocessor pads every image to its config's crop (512 x 512 for the
    stock UperNet), so a 64 x 96 train step would run at 512 x 512 (minutes on 2 cores): the
    models the comparison builds get the tested shape as their crop. Detectors have no crop."""
    from benchmarks import detector
    build = detector.build_detector

    def built(*args, **kwargs):
        model = build(*args, **kwargs)
        if getattr(model.data_preprocessor, 'size', None) is not None:
            model.data_preprocessor.size = tuple(shape)
        return model
    monkeypatch.setattr(detector, 'build_detector', built)


@pytest.mark.parametrize('name, shape, batch', [('mask-rcnn', (96, 128), 1),
                                                ('upernet', (64, 96), 2)])
def test_whole_models_same_weights_predict_and_train(name, shape, batch, monkeypatch):
    from benchmarks.detector import detector_comparison
    from benchmarks.runner import run_comparison
    built_at_the_tested_size(monkeypatch, shape)
    for mode in ('infer', 'train'):
        c = detector_comparison(name, shape, mode, batch=batch)
        assert c.checks['max_abs_diff'] < 1e-4  # backbone + neck features, same weights
        assert tuple(c.x['inputs'].shape) == (batch, 3, *shape)  # what the record names
        memory = mode == 'train' and name == 'mask-rcnn'  # each child builds a whole model
        r = run_comparison(c, repeats=1, threads=torch.get_num_threads(), measure_memory=memory)
        r.update(cpu='test', threads=1)
        assert {k: r[k] for k in CASE} == dict(kind='detector', arch=name, shape=list(shape),
                                               batch=batch, mode=mode, dtype='fp32')
        check_record(r, 'mmdet')
        if memory:
            assert r['mmdet_peak_mb'] > 0 and r['ours_peak_mb'] > 0


def test_v2_prints_one_skip_line_without_transformers(monkeypatch, capsys):
    from benchmarks import v2
    monkeypatch.setattr(v2, 'transformers_available', lambda: False)
    assert load_tool().main(['--arch', 'v2-tiny']) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('skip: transformers is not importable')


MICRO = dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2))  # a 4-stage Swin, tiny


def test_runtimes_against_eager_every_precision_this_cpu_runs(monkeypatch):
    from benchmarks import backbone
    from benchmarks.runner import run_comparison
    from benchmarks.exports import RuntimeExports
    from swin_rpe_plugin.deploy.runtimes import RUNTIMES
    monkeypatch.setitem(backbone.ARCHS, 'micro', MICRO)
    usable = [r for r in RUNTIMES.values() if r.available() is None]
    assert 'onnxruntime' in [r.name for r in usable]
    with RuntimeExports('micro', threads=1) as exports:
        for runtime in usable:
            for precision in runtime.precisions():
                # Neither size is the export's; f32 at both (the dynamic export's exact answer
                # at two sizes), the other precisions at the odd size and batch only: each of
                # those cases loads (int8: quantizes) both exports afresh and shows nothing that
                # another size adds.
                cases = (((64, 96), 1), ((97, 75), 2))
                for shape, batch in cases if precision == 'f32' else cases[1:]:
                    c = exports.comparison(runtime, precision, shape, batch)
                    r = dict(run_comparison(c, repeats=1, threads=1), cpu='test', threads=1)
                    name = runtime.name
                    assert {k: r[k] for k in CASE} == dict(
                        kind='runtime', arch='micro', shape=list(shape), batch=batch,
                        mode='infer', dtype='fp32')
                    assert (r['runtime'], r['precision']) == (name, precision)
                    check_record(r, f'mmdet_{name}', f'ours_{name}')
                    assert r['mmdet_ms'] > 0 and r['ours_ms'] > 0  # eager, timed beside
                    ours, stock = (r[f'{who}_{name}_max_abs_diff'] for who in ('ours', 'mmdet'))
                    assert -1 <= r[f'ours_{name}_cosine'] <= 1 + 1e-9
                    if precision == 'f32':
                        assert ours < 1e-4 and stock < 1e-4
                        assert r[f'ours_{name}_cosine'] > 1 - 1e-9
                    elif precision == 'bf16':  # ~2e-2 of outputs up to ~4 here
                        assert ours < 0.25 and stock < 0.25
                    else:  # int8 calibrated on noise: only as good as the same quantizer on
                        assert ours < 2 * stock  # mmdet's export of the same weights
