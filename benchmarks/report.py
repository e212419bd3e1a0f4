"""docs/performance.md, its charts and the README headline, regenerated from benchmark JSON files.

Each JSON file is one run of ``tools/benchmark.py --json`` (``docs/benchmarks/`` keeps one or
more per CPU class, never fewer: a run on one CPU replaces no other CPU's file). Runs are grouped
by CPU class (:func:`cpu_class`: model name, family/model and the vector features the kernels'
speed turns on), so two machines that share a model name, as KVM guests' bare 'AMD EPYC' of
Zen 3 and Zen 5, keep a section each. Per class: the runs with command, date, commit (and, for
a run transcribed from a table published before its JSON was kept, where it came from); the
matmul peaks measured at their start; one table per kind of comparison; the exact work counts
(records of kind 'work', which no CPU changes); and one chart,
``docs/images/benchmark_<class-slug>.png`` (matplotlib: speedup of every timed record, 1.0
marked). Where two runs of one class measured the same case, the later run's record is shown.
The README block between ``<!-- headline:start -->`` and ``<!-- headline:end -->`` gets one line
per CPU class (its backbone speedups, with date and commit); without those markers the README
is left alone.
"""
import glob
import json
import os
import re
import textwrap
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple

from .format import HOST_COLUMNS, case_label, host_rows, is_timed, other_steps, work_rows

__all__ = ['cpu_slug', 'cpu_class', 'class_label', 'class_slug', 'load_runs', 'latest_records',
           'ladder_table', 'performance_markdown', 'work_table', 'write_chart',
           'headline_markdown', 'load_gpu_runs', 'write_report']

HEADLINE = ('<!-- headline:start -->', '<!-- headline:end -->')
KINDS = OrderedDict([('backbone', 'Backbone: mmdet 3.3 SwinTransformer vs ours'),
                     ('v2', "SwinV2: transformers' Swinv2Model vs ours"),
                     ('runtime', 'Exported backbone in a runtime (mmdet fixed-size export vs '
                      'our dynamic export; eager beside)'),
                     ('detector', 'Whole model: stock config vs the same with our backbone'),
                     ('padding-aware', 'Padding-aware option: off vs on (our Mask R-CNN, '
                      'speedup = off / on)')])
WORK_TITLE = 'Work outside the matrix products (exact counts)'
CASE_FIELDS = ('kind', 'arch', 'shape', 'batch', 'mode', 'dtype', 'runtime', 'precision',
               'mask_padding', 'window', 'backend', 'tables', 'drop_path_rate', 'with_cp')
HOST_TITLE = "What a GPU's host pays per step (exact counts, and thread time at one thread)"
CpuClass = Tuple[str, Optional[str], Tuple[str, ...]]


def cpu_slug(cpu: str) -> str:
    """'AMD EPYC 7B13 64-Core Processor' -> 'amd-epyc-7b13-64-core-processor'."""
    return re.sub(r'[^a-z0-9]+', '-', cpu.lower()).strip('-') or 'unknown'


def cpu_class(run: dict) -> CpuClass:
    """(model name, family/model or None where not recorded, sorted vector features): what one
    section of the report, one chart and one headline line stand for."""
    return (run['cpu'], run.get('cpu_family_model') or None,
            tuple(sorted(run.get('cpu_features') or ())))


def class_label(key: CpuClass, runs: Sequence[dict] = ()) -> str:
    """'AMD EPYC (family/model 25/1, avx2)'; a run's ``cpu_class`` name goes first
    ('AMD Zen 5 (AVX-512): AMD EPYC (family/model not recorded, avx512f)')."""
    cpu, family_model, features = key
    label = (f"{cpu} (family/model {family_model or 'not recorded'}, "
             f"{', '.join(features) or 'no features recorded'})")
    names = [r['cpu_class'] for r in runs if r.get('cpu_class')]
    return f'{names[0]}: {label}' if names else label


def class_slug(key: CpuClass) -> str:
    """'amd-epyc-25-1-avx2': the chart's file name part, one per class."""
    cpu, family_model, features = key
    return cpu_slug(' '.join([cpu, family_model or 'family-model-not-recorded', *features]))


def load_runs(paths: Sequence[str]) -> Dict[CpuClass, List[dict]]:
    """CPU class -> its runs (the JSON objects, oldest first), the class measured last first; a
    one-line error for a file that is not a benchmark JSON."""
    by_class: Dict[CpuClass, List[dict]] = OrderedDict()
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        if not isinstance(run, dict) or 'records' not in run or 'cpu' not in run:
            raise ValueError(f'{path}: not a tools/benchmark.py --json file (no cpu/records); '
                             'write one with --json')
        by_class.setdefault(cpu_class(run), []).append(run)
    for runs in by_class.values():
        runs.sort(key=lambda r: r.get('date') or '')
    # newest class first, whatever order the files came in
    return OrderedDict(sorted(by_class.items(), key=lambda kv: kv[1][-1].get('date') or '',
                              reverse=True))


def latest_records(runs: List[dict]) -> List[dict]:
    """Every case once (work counts included), from the latest run that measured it, in
    first-seen order."""
    cases: Dict[tuple, dict] = OrderedDict()
    for run in runs:
        for record in run['records']:
            key = tuple(json.dumps(record.get(f)) for f in CASE_FIELDS)
            cases[key] = record
    return list(cases.values())


def _ms(record: dict, name: str) -> str:
    value = record.get(f'{name}_ms')
    return '-' if value is None else f'{value:.0f}' if value >= 100 else f'{value:.1f}'


def _num(value, fmt: str) -> str:
    return '-' if value is None else format(value, fmt)


def _code(command: Optional[str]) -> str:
    return 'not recorded' if not command else f'`{command}`'


def _table(records: List[dict]) -> List[str]:
    lines = ['| case | baseline | baseline ms | ours ms | speedup | other steps (ms) | '
             'memory ours/baseline | max abs diff | rel err vs fp32 | roofline | flags |',
             '|---|---|---|---|---|---|---|---|---|---|---|']
    for r in records:
        base, cand = r['baseline'], r.get('candidate', 'ours')
        others = ', '.join(f'{n} {_ms(r, n)}' for n in other_steps(r)) or '-'
        lines.append(
            f"| {case_label(r)} | {base} | {_ms(r, base)} | {_ms(r, cand)} | "
            f"**{r['speedup']:.2f}** | {others} | {_num(r.get('mem_ratio'), '.2f')} | "
            f"{_num(r.get('max_abs_diff'), '.1e')} | {_num(r.get('rel_err_vs_fp32'), '.1e')} | "
            f"{_num(r.get('roofline_fraction'), '.2f')} | {_flags(r)} |")
    return lines


def work_table(records: List[dict]) -> List[str]:
    """The exact work counts: one row per (case, side), ratios to the baseline's side."""
    lines = ['| case | side | kernels | x base | product GFLOPs | MB outside products | '
             'x base | MB kept for backward | x base | allocator peak MB | x base | '
             'largest kinds (MB) |',
             '|---|---|---|---|---|---|---|---|---|---|---|---|']
    for record in records:
        for w in work_rows(record):
            largest = ', '.join(f'{kind}: {mb:.1f}' for kind, mb in w['largest']) or '-'
            lines.append(
                f"| {w['case']} | {w['side']} | {_num(w['kernels'], 'd')} | "
                f"{_num(w['kernels_ratio'], '.2f')} | {w['product_gflops']:.2f} | "
                f"{_num(w['outside_mb'], '.1f')} | {_num(w['outside_ratio'], '.2f')} | "
                f"{_num(w['saved_mb'], '.1f')} | {_num(w['saved_ratio'], '.2f')} | "
                f"{_num(w['peak_mb'], '.1f')} | {_num(w['peak_ratio'], '.2f')} | {largest} |")
    return lines


def _flags(record: dict) -> str:
    return ' '.join(record.get('flags') or []) or '-'


def _commit(run: dict) -> str:
    commit = run.get('commit') or '-'
    return f'{commit} (transcribed)' if run.get('transcribed') else commit


def _malloc(run: dict) -> str:
    """How the run's timing process allocated: recorded since 2026-12-03; runs before it (and
    runs that time nothing) used the default."""
    if all(r.get('kind') == 'work' for r in run.get('records') or ()):
        return '-'
    return run.get('malloc') or 'default'


LADDER_TITLE = 'Memory ladder: big backbones at detection sizes (train step)'
LADDER_ARCHS = ('base', 'large')
# mmdet's projects/example_largemodel (DINO Swin-L, A100, the whole detector): GPU memory and
# step time of each row, beside which ours is measured (GPU rows filled in when one is lent).
LARGEMODEL = {('fp32', False): '49 GB, 0.9 s', ('bf16', False): '39 GB, 1.2 s',
              ('fp32', True): '33 GB, 1.1 s', ('bf16', True): '25 GB, 1.3 s'}


def ladder_table(records: List[dict]) -> List[str]:
    """One row per Swin-B/L train record (baseline, bf16 AMP, with_cp, both): each side's peak
    RSS of a step in a fresh process and the step time, ours / mmdet's; the targets of issue
    54 beside (peak <= 0.65x without checkpointing, <= 0.8x with it, time <= 1x)."""
    rows = [r for r in records if r.get('kind', 'backbone') == 'backbone'
            and r.get('arch') in LADDER_ARCHS and r.get('mode') == 'train']
    if not rows:
        return []
    rows.sort(key=lambda r: (LADDER_ARCHS.index(r['arch']), r['shape'], bool(r.get('with_cp')),
                             r['dtype'] != 'fp32'))
    lines = ['| case | mmdet peak MB | ours peak MB | peak ours/mmdet (target) | mmdet s | '
             'ours s | time ours/mmdet | mmdet example_largemodel, DINO Swin-L on A100 |',
             '|---|---|---|---|---|---|---|---|']
    for r in rows:
        cp = bool(r.get('with_cp'))
        peak = r.get('mem_ratio')
        time = r['ours_ms'] / r['mmdet_ms']
        lines.append(
            f"| {case_label(r)} | {_num(r.get('mmdet_peak_mb'), '.0f')} | "
            f"{_num(r.get('ours_peak_mb'), '.0f')} | {_num(peak, '.2f')} "
            f"(<= {0.8 if cp else 0.65}) | {r['mmdet_ms'] / 1e3:.1f} | {r['ours_ms'] / 1e3:.1f} | "
            f"{time:.2f} | {LARGEMODEL.get((r['dtype'], cp), '-')} |")
    return lines


def performance_markdown(by_class: Dict[CpuClass, List[dict]], chart_dir: str = 'images') -> str:
    """The whole docs/performance.md."""
    out = ['# Performance', '',
           'Generated by `tools/benchmark.py --report` from the JSON of `tools/benchmark.py '
           '--json` in docs/benchmarks (one or more files per CPU class; a run on one CPU '
           'replaces no other CPU\'s); do not edit by hand. One section per CPU class (model '
           'name, family/model, vector features); its figures stand until that class is '
           'measured again. Timings are medians of interleaved runs in one process; speedup = '
           'baseline ms / ours ms; malloc says whether the timing process kept freed memory '
           'for reuse (glibc\'s malloc otherwise maps blocks of 32 MiB and more afresh each '
           'time, so a step pays page faults that depend on what ran before it: a few per '
           'cent, for either side); memory is the peak RSS a step adds, each side in a fresh '
           'process with the default malloc; roofline is the fraction of the matmul peak of '
           'the record\'s dtype (measured in the same rounds as the models) that our step '
           'reaches. A run marked '
           'transcribed was copied from a table published before its JSON was kept: its notes '
           'say from where and what was not recorded.', '']
    for key, runs in by_class.items():
        cpu, family_model, features = key
        label = class_label(key, runs)
        out += [f'## {label}', '',
                f"CPU model name \"{cpu}\", family/model {family_model or 'not recorded'}, "
                f"features: {', '.join(features) or 'not recorded'}.", '',
                '| date | commit | threads | torch | matmul GFLOP/s | malloc | command |',
                '|---|---|---|---|---|---|---|']
        for run in runs:
            peaks = ', '.join(f'{k} {v:.0f}' for k, v in (run.get('matmul_gflops') or {}).items())
            out.append(f"| {run.get('date') or '-'} | {_commit(run)} | "
                       f"{run.get('threads') or '-'} | {run.get('torch') or '-'} | "
                       f"{peaks or '-'} | {_malloc(run)} | {_code(run.get('command'))} |")
        notes = [f"- {run.get('date') or '-'}, commit {run.get('commit') or '-'}: "
                 f"{run['transcribed']}" for run in runs if run.get('transcribed')]
        if notes:
            out += ['', 'Transcribed runs:', ''] + notes
        records = latest_records(runs)
        timed = [r for r in records if is_timed(r)]
        flagged = sum(bool(r.get('flags')) for r in timed)
        if flagged:
            out += ['', f'{flagged} record(s) flagged (roofline > 1 or a busy machine): treat '
                    'them with care.']
        for kind, title in KINDS.items():
            rows = [r for r in timed if r.get('kind', 'backbone') == kind]
            if rows:
                out += ['', f'### {title}', ''] + _table(rows)
        ladder = ladder_table(timed)
        if ladder:
            out += ['', f'### {LADDER_TITLE}', '',
                    'Swin-B and Swin-L as mmdet\'s configs build them (window 7), ours against '
                    'mmdet 3.3\'s with the same weights, one train step at batch 1: the peak '
                    'RSS the step adds, each side in a fresh process, and the median step time '
                    'of the same run; with_cp rows checkpoint both sides\' blocks, bf16 rows '
                    'run both under autocast. The last column is mmdet\'s own ladder for the '
                    'whole detector on a GPU (projects/example_largemodel), for the shape of '
                    'the curve.', ''] + ladder
        work = [r for r in records if r.get('kind') == 'work']
        if work:
            out += ['', f'### {WORK_TITLE}', '',
                    'Counted, not timed, so the same on any CPU (`tools/benchmark.py --work`): '
                    'per side, the aten kernels a step launches, the FLOPs of the matrix '
                    'products, the bytes moved outside them '
                    '(the two largest kinds beside), the bytes kept for backward (train) and the '
                    'allocator peak; x base is the ratio to the baseline\'s side (mmdet\'s; '
                    'transformers\' for SwinV2); MB = 2^20 bytes.',
                    ''] + work_table(work)
        host = host_rows(records)
        if host:
            out += ['', f'### {HOST_TITLE}', '',
                    '`tools/benchmark.py --host` (`benchmarks/host.py`): on the generic path '
                    '(what a GPU runs), Swin-T\'s depth at 16 channels on 64x64 images, where '
                    'the arithmetic vanishes and what is left is the host\'s work per step: '
                    'Python calls (function and C calls, `sys.setprofile`), ATen ops '
                    'dispatched at the top level (views and no-op casts included) and the '
                    'calling thread\'s CPU time (one thread, median of interleaved steps); '
                    'tables frozen in both models (trained tables: Python calls only); '
                    'x = ours / mmdet\'s. A whole-model row counts the train step of the stock '
                    'config with each backbone and, beside it, that backbone alone.', '',
                    '| ' + ' | '.join(HOST_COLUMNS) + ' |',
                    '|' + '---|' * len(HOST_COLUMNS)]
            out += ['| ' + ' | '.join(row) + ' |' for row in host]
        if timed:
            last = runs[-1]
            commanded = [run for run in runs if run.get('command')]
            latest = f"`{commanded[-1]['command']}`" if commanded else 'commands not recorded'
            out += ['', f'![speedup per record on {cpu}]({chart_dir}/benchmark_'
                    f'{class_slug(key)}.png)',
                    f"Speedup of every record above: {label}, "
                    f"{str(last.get('date') or '?')[:10]}, drawn by `tools/benchmark.py "
                    f"--report` from the runs in the table (latest command: {latest})."]
        out.append('')
    return '\n'.join(out)


def write_chart(cpu: str, records: List[dict], path: str) -> None:
    """Horizontal bars: the speedup of every timed record over its baseline, 1.0 marked."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    records = [r for r in records if is_timed(r)]
    labels = [f"{r.get('kind', 'backbone')}: {case_label(r)}" for r in records]
    speedups = [r['speedup'] for r in records]
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(records) + 1.2))
    colors = ['tab:green' if s >= 1 else 'tab:red' for s in speedups]
    ax.barh(range(len(records)), speedups, color=colors)
    ax.axvline(1.0, color='black', linewidth=0.8)
    ax.set_yticks(range(len(records)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel('speedup over the baseline (baseline ms / ours ms)')
    ax.set_title('\n'.join(textwrap.wrap(cpu, 70)), fontsize=10)  # a class label can be long
    for i, s in enumerate(speedups):
        ax.text(s, i, f' {s:.2f}', va='center', fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _short_label(record: dict) -> str:
    """case_label without the arch where it is Swin-T's."""
    label = case_label(record)
    return label[len('tiny '):] if record.get('arch') == 'tiny' else label


def load_gpu_runs(root: str) -> List[dict]:
    """The JSONs ``tools/device_check.py`` wrote under docs/benchmarks/gpu, by device name."""
    runs = []
    for path in sorted(glob.glob(os.path.join(root, 'docs', 'benchmarks', 'gpu', '*.json'))):
        with open(path) as f:
            runs.append(json.load(f))
    return sorted(runs, key=lambda run: run.get('device', ''))


def _gpu_line(run: dict) -> str:
    """A headline row of one GPU: eager train and inference speedups, memory ratio beside."""
    records = [r for r in run.get('speed', []) if '+compile' not in r['mode']]
    cases = '; '.join(
        f"{_short_label(r)} **{r['speedup']:.2f}**"
        + (f" ({r['mem_ratio']:.2f})" if r.get('mem_ratio') is not None else '')
        for r in records) or '-'
    measured = f"{run.get('date') or '?'}, commit {run.get('commit') or '-'}"
    return f"| {run['device']} (GPU, torch {run.get('torch', '?')}) | {measured} | {cases} |"


def headline_markdown(by_class: Dict[CpuClass, List[dict]],
                      gpu_runs: Sequence[dict] = ()) -> str:
    """The README block: one line per CPU class with the speedups of its eager Swin-T backbone
    records (memory ratio beside; compiled, mask_padding, with_cp, generic-backend and bigger
    backbones' lines only on the page) and the date and commit of the runs they came from."""
    lines = ['Ours against mmdet 3.3\'s Swin-T backbone (same config and weights, eager): '
             'speedup (memory ours/mmdet) per CPU class, until that class is measured again '
             '(transcribed: from a table published before JSONs were kept):', '',
             '| CPU class | measured | speedup (memory) per case |', '|---|---|---|']
    for key, runs in by_class.items():
        backbone = [r for r in latest_records(runs)  # eager, default options: the rest below
                    if is_timed(r) and r.get('kind', 'backbone') == 'backbone'
                    and r['mode'] in ('infer', 'train') and not r.get('mask_padding')
                    and not r.get('backend') and not r.get('with_cp')
                    and r.get('arch', 'tiny') == 'tiny']
        shown = {id(r) for r in backbone}
        sources = [run for run in runs if any(id(r) in shown for r in run['records'])]
        measured = '; '.join(f"{run.get('date') or '?'}, commit {_commit(run)}"
                             # freed memory kept while timing (the default otherwise)
                             + (', malloc kept memory' if run.get('malloc', 'default')
                                != 'default' else '') for run in sources) or '-'
        cases = '; '.join(
            f"{_short_label(r)} **{r['speedup']:.2f}**"
            + (f" ({r['mem_ratio']:.2f})" if r.get('mem_ratio') is not None else '')
            + (f" {_flags(r)}" if r.get('flags') else '')
            for r in backbone) or 'no backbone timing (other comparisons on the page below)'
        lines.append(f'| {class_label(key, runs)} | {measured} | {cases} |')
    lines += [_gpu_line(run) for run in gpu_runs]  # tools/device_check.py's, one per GPU
    return '\n'.join(lines)  # the README links the page itself, after the block


def write_report(paths: Sequence[str], root: str) -> List[str]:
    """Write docs/performance.md, one chart per CPU class with timed records and the README
    headline (if its markers exist) under ``root``; return the paths written."""
    by_class = load_runs(paths)
    images = os.path.join(root, 'docs', 'images')
    os.makedirs(images, exist_ok=True)
    written = []
    for key, runs in by_class.items():
        records = [r for r in latest_records(runs) if is_timed(r)]
        if records:
            chart = os.path.join(images, f'benchmark_{class_slug(key)}.png')
            write_chart(class_label(key, runs), records, chart)
            written.append(chart)
    doc = os.path.join(root, 'docs', 'performance.md')
    with open(doc, 'w') as f:
        f.write(performance_markdown(by_class))
    written.append(doc)
    readme = os.path.join(root, 'README.md')
    if os.path.isfile(readme):
        with open(readme) as f:
            text = f.read()
        start, end = text.find(HEADLINE[0]), text.find(HEADLINE[1])
        if 0 <= start < end:
            text = (text[:start + len(HEADLINE[0])] + '\n'
                    + headline_markdown(by_class, load_gpu_runs(root)) + '\n' + text[end:])
            with open(readme, 'w') as f:
                f.write(text)
            written.append(readme)
    return written
