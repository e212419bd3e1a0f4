"""docs/performance.md and the README headline keep every CPU class of docs/benchmarks, and the
exact work counts (records of kind 'work') get their own table and stay out of the others.

No benchmark runs here: the committed JSONs and hand-written records only.
"""
import copy
import glob
import json
import os

import pytest

from benchmarks.format import MB, format_host, format_work, work_rows
from benchmarks.report import (HEADLINE, HOST_TITLE, WORK_TITLE, class_label, class_slug, cpu_class,
                               headline_markdown, load_gpu_runs, load_runs,
                               performance_markdown, write_report)
from benchmarks.runner import KEPT_MALLOC

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JSONS = sorted(glob.glob(os.path.join(ROOT, 'docs', 'benchmarks', '*.json')))
REGENERATE = '.venv/bin/python tools/benchmark.py --report docs/benchmarks/*.json'


def read(path: str) -> str:
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def headline_block(text: str) -> str:
    start, end = text.index(HEADLINE[0]) + len(HEADLINE[0]) + 1, text.index(HEADLINE[1])
    return text[start:end].rstrip('\n')


def test_every_cpu_class_of_docs_benchmarks_keeps_a_section_and_a_headline_line():
    classes = {}
    for path in JSONS:
        with open(path) as f:
            run = json.load(f)
        classes.setdefault(cpu_class(run), []).append(run)
    assert len(classes) >= 3, sorted(classes)  # Zen 3, Zen 5 and Intel AMX at least
    by_class = load_runs(JSONS)
    assert set(by_class) == set(classes)
    doc = performance_markdown(by_class)
    headline = headline_markdown(by_class).splitlines()
    for key, runs in classes.items():
        label = class_label(key, runs)
        assert doc.count(f'## {label}\n') == 1, label
        assert f'images/benchmark_{class_slug(key)}.png' in doc
        rows = [line for line in headline if line.startswith(f'| {label} |')]
        assert len(rows) == 1, label
        for run in runs:  # every run's date and commit stays on the page
            assert run['date'] in doc and run['commit'] in doc
        backbone_runs = [run for run in runs
                         if any(r.get('kind') == 'backbone' for r in run['records'])]
        assert any(run['commit'] in rows[0] and run['date'] in rows[0] for run in backbone_runs)
    assert 'until that class is measured again' in '\n'.join(headline)


def test_committed_page_and_readme_headline_are_what_the_report_regenerates():
    by_class = load_runs(JSONS)
    assert read('docs/performance.md') == performance_markdown(by_class), \
        f'docs/performance.md is stale: run `{REGENERATE}`'
    assert headline_block(read('README.md')) == headline_markdown(by_class,
                                                                 load_gpu_runs(ROOT)), \
        f'the README headline is stale: run `{REGENERATE}`'
    for key, runs in by_class.items():
        assert os.path.isfile(os.path.join(ROOT, 'docs', 'images',
                                           f'benchmark_{class_slug(key)}.png')), \
            f'no chart for {class_label(key, runs)}: run `{REGENERATE}`'
    charts = glob.glob(os.path.join(ROOT, 'docs', 'images', 'benchmark_*.png'))
    assert sorted(os.path.basename(c) for c in charts) == sorted(
        f'benchmark_{class_slug(k)}.png' for k in by_class)  # no chart of a class gone


def _run(cpu='AMD EPYC', family_model='25/1', features=('avx2',), date='2026-12-01 10:00 UTC',
         commit='aaaaaaa', speedup=1.5, records=None):
    record = dict(kind='backbone', arch='tiny', shape=[64, 64], batch=1, mode='infer',
                  dtype='fp32', baseline='mmdet', candidate='ours', mmdet_ms=3.0,
                  ours_ms=3.0 / speedup, speedup=speedup, flags=[])
    return dict(cpu=cpu, cpu_family_model=family_model, cpu_features=list(features), threads=2,
                torch='2.x', matmul_gflops={'fp32': 100.0}, command='tools/benchmark.py --quick',
                date=date, commit=commit, records=[record] if records is None else records)


def _write(tmp_path, runs):
    paths = []
    for i, run in enumerate(runs):
        path = tmp_path / f'run{i}.json'
        path.write_text(json.dumps(run))
        paths.append(str(path))
    return paths


def test_one_model_name_on_two_cpu_classes_keeps_two_sections(tmp_path):
    """Zen 3 and Zen 5 guests both say 'AMD EPYC': the later run must not replace the other's."""
    zen3 = _run(commit='zen3aaa', speedup=1.1)
    zen5 = _run(family_model='26/2', features=('avx2', 'avx512f'), date='2026-12-02 10:00 UTC',
                commit='zen5bbb', speedup=1.9)
    zen3_again = _run(date='2026-12-03 10:00 UTC', commit='zen3ccc', speedup=1.2)
    by_class = load_runs(_write(tmp_path, [zen3, zen5, zen3_again]))
    assert list(by_class) == [cpu_class(zen3), cpu_class(zen5)]  # newest first
    headline = headline_markdown(by_class)
    assert '**1.20**' in headline and '**1.90**' in headline and '**1.10**' not in headline
    assert 'zen3ccc' in headline and 'zen5bbb' in headline and 'zen3aaa' not in headline
    doc = performance_markdown(by_class)
    assert doc.count('\n## AMD EPYC (family/model ') == 2
    assert 'zen3aaa' in doc  # the older run of a class stays in its run table


def test_run_table_says_how_each_timing_process_allocated(tmp_path):
    """Runs before the malloc field were timed with the default; a work-only run times nothing."""
    kept = dict(_run(date='2026-12-03 10:00 UTC', commit='keptaaa'), malloc=KEPT_MALLOC)
    runs = [_run(commit='olderbb'), kept, _run(date='2026-12-03 11:00 UTC', commit='workccc',
                                              records=[_work_record()])]
    doc = performance_markdown(load_runs(_write(tmp_path, runs)))
    header = next(line for line in doc.splitlines() if line.startswith('| date |'))
    column = header.split(' | ').index('malloc')
    malloc = {commit: line.split(' | ')[column] for line in doc.splitlines()
              for commit in ('olderbb', 'keptaaa', 'workccc') if f'| {commit} |' in line}
    assert malloc == dict(olderbb='default', keptaaa=KEPT_MALLOC, workccc='-')


def _work_record():
    """Numbers chosen so every ratio is exact: ours moves half of mmdet's bytes, keeps a quarter
    for backward and peaks at three quarters; the generic path has no peak recorded."""
    def side(kernels, flops, outside, saved, peak, kinds):
        return dict(kernels=kernels, product_flops=flops, bytes_outside=outside,
                    bytes_by_kind=kinds, saved_bytes=saved, peak_bytes=peak)
    return dict(kind='work', arch='tiny', shape=[224, 224], batch=1, mode='train', dtype='bf16',
                sides={'ours_generic': side(800, 9 * 10 ** 9, 300 * MB, 100 * MB, None,
                                            {'attention': 200 * MB, 'norm': 100 * MB}),
                       'mmdet': side(1000, 9 * 10 ** 9, 400 * MB, 200 * MB, 800 * MB,
                                     {'attention': 150 * MB, 'cast/copy': 200 * MB,
                                      'norm': 50 * MB}),
                       'ours': side(500, 9 * 10 ** 9, 200 * MB, 50 * MB, 600 * MB,
                                    {'cast/copy': 20 * MB, 'window gather/scatter': 80 * MB,
                                     'bias prefill': 0, 'attention': 100 * MB})})


def test_work_rows_and_their_ratios_to_mmdet():
    rows = work_rows(_work_record())
    assert [r['side'] for r in rows] == ['mmdet', 'ours', 'ours_generic']
    mmdet, ours, generic = rows
    assert {r['case'] for r in rows} == {'tiny 224x224 b1 train bf16'}
    assert all(r['product_gflops'] == 9.0 for r in rows)
    assert (mmdet['kernels'], ours['kernels_ratio'], generic['kernels_ratio']) == (1000, 0.5, 0.8)
    assert (mmdet['outside_mb'], mmdet['outside_ratio']) == (400, 1.0)
    assert (ours['outside_mb'], ours['outside_ratio']) == (200, 0.5)
    assert (ours['saved_mb'], ours['saved_ratio']) == (50, 0.25)
    assert (ours['peak_mb'], ours['peak_ratio']) == (600, 0.75)
    assert (generic['outside_ratio'], generic['saved_ratio']) == (0.75, 0.5)
    assert generic['peak_mb'] is None and generic['peak_ratio'] is None
    assert mmdet['largest'] == [('cast/copy', 200), ('attention', 150)]
    assert ours['largest'] == [('attention', 100), ('window gather/scatter', 80)]
    infer = copy.deepcopy(_work_record())
    infer['mode'] = 'infer'
    for side in infer['sides'].values():
        side['saved_bytes'] = None
    assert all(r['saved_mb'] is None and r['saved_ratio'] is None for r in work_rows(infer))
    lines = format_work([_work_record()]).splitlines()
    assert len(lines) == 5 and lines[3].split(' | ')[1].strip() == 'ours'
    assert [c.strip() for c in lines[3].split(' | ')[2:11]] == [
        '500', '0.50', '9.00', '200.0', '0.50', '50.0', '0.25', '600.0', '0.75']


def test_report_takes_work_records_beside_timed_ones(tmp_path):
    """A JSON mixing work counts with timed records: the work table per CPU section, and no
    other table, headline line or chart bar for them."""
    run = _run()
    run['records'].append(_work_record())
    (tmp_path / 'README.md').write_text(f'x\n{HEADLINE[0]}\n{HEADLINE[1]}\n')
    written = write_report(_write(tmp_path, [run]), str(tmp_path))
    doc = (tmp_path / 'docs' / 'performance.md').read_text()
    section = doc.split(f'### {WORK_TITLE}\n', 1)[1]
    rows = [line.split(' | ') for line in section.splitlines()
            if line.startswith('| tiny 224x224 b1 train bf16 |')]
    assert [r[1] for r in rows] == ['mmdet', 'ours', 'ours_generic']
    mmdet, ours, generic = rows
    assert mmdet[2:11] == ['1000', '1.00', '9.00', '400.0', '1.00', '200.0', '1.00', '800.0',
                           '1.00']
    assert ours[2:11] == ['500', '0.50', '9.00', '200.0', '0.50', '50.0', '0.25', '600.0', '0.75']
    assert generic[9:11] == ['-', '-']
    assert ours[11] == 'attention: 100.0, window gather/scatter: 80.0 |'
    backbone = doc.split('### Backbone', 1)[1].split('###', 1)[0]
    assert '224x224' not in backbone and doc.count('224x224') == 3
    readme = (tmp_path / 'README.md').read_text()
    assert '224x224' not in readme and '64x64 b1 infer fp32 **1.50**' in readme
    charts = [p for p in written if p.endswith('.png')]
    assert len(charts) == 1
    import matplotlib.image
    assert matplotlib.image.imread(charts[0]).ndim == 3


def _host_records():
    """A backbone host record and a whole-model one, numbers chosen so every ratio is exact."""
    backbone = dict(kind='host', arch='host-tiny', shape=[64, 64], batch=2, mode='train',
                    dtype='fp32', drop_path_rate=0.2, backend='generic',
                    sides={'mmdet': dict(python_calls=4000, python_calls_tables_trained=4000,
                                         aten_ops=2000, thread_ms=40.0),
                           'ours': dict(python_calls=2000, python_calls_tables_trained=2400,
                                        aten_ops=1000, thread_ms=30.0)},
                    ratios=dict(python_calls=0.5, python_calls_tables_trained=0.6,
                                aten_ops=0.5, thread_ms=0.75))
    whole = dict(kind='host-detector', arch='mask-rcnn', shape=[320, 320], batch=2,
                 mode='train', dtype='fp32', backend='generic',
                 sides={'mmdet': dict(python_calls=10000, aten_ops=5000,
                                      backbone_python_calls=4000, backbone_aten_ops=2000),
                        'ours': dict(python_calls=8000, aten_ops=4000,
                                     backbone_python_calls=2000, backbone_aten_ops=1000)},
                 ratios=dict(python_calls=0.8, aten_ops=0.8))
    return [backbone, whole]


def test_report_takes_host_records_in_a_table_of_their_own(tmp_path):
    """Host counts (tools/benchmark.py --host): ours / mmdet and the ratio per count, the
    backbone's own beside a whole model's; no other table, headline line or chart bar."""
    run = _run()
    run['records'] += _host_records()
    (tmp_path / 'README.md').write_text(f'x\n{HEADLINE[0]}\n{HEADLINE[1]}\n')
    written = write_report(_write(tmp_path, [run]), str(tmp_path))
    doc = (tmp_path / 'docs' / 'performance.md').read_text()
    section = doc.split(f'### {HOST_TITLE}\n', 1)[1].split('###', 1)[0]
    rows = [line.split(' | ') for line in section.splitlines() if line.startswith('| host-')
            or line.startswith('| mask-rcnn')]
    assert rows[0][1:8] == ['2000 / 4000', '0.50', '0.60', '1000 / 2000', '0.50',
                            '30.00 / 40.00', '0.75']
    assert rows[0][0] == '| host-tiny 64x64 b2 train fp32 drop path 0.2 generic path'
    assert rows[1][0].endswith('whole model') and rows[1][1:5] == [
        '8000 / 10000', '0.80', '-', '4000 / 5000']
    assert rows[1][8:] == ['2000 / 4000', '1000 / 2000 |']
    assert doc.count('64x64 b2 train') == 1 and doc.count('320x320') == 1
    readme = (tmp_path / 'README.md').read_text()
    assert '64x64 b2' not in readme and '320x320' not in readme
    assert len([p for p in written if p.endswith('.png')]) == 1
    assert format_host(_host_records()).splitlines()[2].split(' | ')[2].strip() == '0.50'


def test_a_class_with_work_counts_only_gets_no_chart(tmp_path):
    run = _run(records=[_work_record()])
    written = write_report(_write(tmp_path, [run]), str(tmp_path))
    assert not [p for p in written if p.endswith('.png')]
    doc = (tmp_path / 'docs' / 'performance.md').read_text()
    assert WORK_TITLE in doc and '![' not in doc
    assert 'no backbone timing' in headline_markdown(load_runs(_write(tmp_path, [run])))


@pytest.mark.parametrize('bad', [{'a': 1}, [1, 2]])
def test_report_refuses_a_file_that_is_not_a_benchmark_json(tmp_path, bad):
    path = tmp_path / 'x.json'
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match='not a tools/benchmark.py --json file'):
        load_runs([str(path)])


def test_a_device_check_json_gives_the_headline_a_gpu_line(tmp_path):
    """tools/device_check.py's JSON under docs/benchmarks/gpu: one headline row per GPU with its
    eager speedups and memory ratios; compiled records stay on the JSON."""
    gpu = tmp_path / 'docs' / 'benchmarks' / 'gpu'
    gpu.mkdir(parents=True)
    eager = dict(arch='tiny', shape=[800, 1216], batch=2, mode='train', dtype='bf16',
                 speedup=1.4, mem_ratio=0.55)
    compiled = dict(eager, mode='train+compile', speedup=1.2)
    (gpu / 'nvidia-h200.json').write_text(json.dumps(dict(
        device='NVIDIA H200', torch='2.11.0', date='2026-12-05 10:00 UTC', commit='abc1234',
        parity=[], speed=[eager, compiled])))
    (tmp_path / 'README.md').write_text(f'x\n{HEADLINE[0]}\n{HEADLINE[1]}\n')
    write_report(_write(tmp_path, [_run()]), str(tmp_path))
    rows = [line for line in headline_block((tmp_path / 'README.md').read_text()).splitlines()
            if 'GPU' in line]
    assert rows == ['| NVIDIA H200 (GPU, torch 2.11.0) | 2026-12-05 10:00 UTC, commit abc1234 | '
                    '800x1216 b2 train bf16 **1.40** (0.55) |']


def _ladder_record(arch, dtype, with_cp, mmdet_mb, ours_mb, mmdet_ms, ours_ms):
    record = dict(kind='backbone', arch=arch, shape=[800, 1333], batch=1, mode='train',
                  dtype=dtype, baseline='mmdet', candidate='ours', mmdet_ms=mmdet_ms,
                  ours_ms=ours_ms, speedup=mmdet_ms / ours_ms, mmdet_peak_mb=mmdet_mb,
                  ours_peak_mb=ours_mb, mem_ratio=ours_mb / mmdet_mb, flags=[])
    return dict(record, with_cp=True) if with_cp else record


def test_memory_ladder_rows_beside_mmdets_gpu_ladder(tmp_path):
    """Swin-B/L train records make the ladder: baseline, bf16, with_cp, both, per arch, each
    with its peak and time ratios, its target and mmdet's example_largemodel row; a with_cp
    record does not replace the record of the same case without it."""
    records = [_ladder_record('large', 'bf16', True, 4000, 3000, 9000, 6000),
               _ladder_record('large', 'fp32', False, 10000, 6000, 30000, 20000),
               _ladder_record('base', 'fp32', True, 5000, 3500, 20000, 14000),
               _ladder_record('large', 'fp32', True, 5000, 3500, 40000, 28000)]
    doc = performance_markdown(load_runs(_write(tmp_path, [_run(records=records)])))
    table = doc[doc.index('### Memory ladder'):].split('\n\n')[2].splitlines()[2:]
    assert [row.split(' | ')[0] for row in table] == [
        '| base 800x1333 b1 train fp32 with_cp', '| large 800x1333 b1 train fp32',
        '| large 800x1333 b1 train fp32 with_cp', '| large 800x1333 b1 train bf16 with_cp']
    assert table[1].split(' | ')[3:7] == ['0.60 (<= 0.65)', '30.0', '20.0', '0.67']
    assert table[3].split(' | ')[3] == '0.75 (<= 0.8)' and table[3].endswith('25 GB, 1.3 s |')
