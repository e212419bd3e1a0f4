"""Console output of the benchmark: one table over every kind of record, the profile table, and
the rows of the exact work counts (records of kind 'work')."""
from typing import List, Optional

__all__ = ['format_table', 'format_profile', 'format_work', 'format_host', 'host_rows',
           'other_steps', 'case_label', 'is_timed', 'work_rows', 'WORK_SIDES', 'MB']

MB = 2 ** 20  # the work tables' MB, as the peak memory of the timed records
WORK_SIDES = ('mmdet', 'ours', 'ours_generic')  # the order of a work record's sides

COLUMNS = ['kind', 'arch', 'shape', 'batch', 'mode', 'dtype', 'precision', 'baseline',
           'baseline_ms', 'ours_ms', 'speedup', 'others', 'baseline_peak_mb', 'ours_peak_mb',
           'mem_ratio', 'max_abs_diff', 'rel_err_vs_fp32', 'gflops', 'roofline_fraction', 'flags']


def other_steps(record: dict) -> List[str]:
    """Names of the timed steps beside baseline and candidate (our eager step next to compiled
    ones, eager models next to runtimes)."""
    named = {record.get('baseline'), record.get('candidate')}
    return [k[:-3] for k in record if k.endswith('_ms') and not k.endswith('spread_ms')
            and k[:-3] not in named]


def _cell(record: dict, column: str) -> str:
    base, cand = record.get('baseline'), record.get('candidate', 'ours')
    value = {'baseline_ms': record.get(f'{base}_ms'), 'ours_ms': record.get(f'{cand}_ms'),
             'baseline_peak_mb': record.get(f'{base}_peak_mb'),
             'ours_peak_mb': record.get(f'{cand}_peak_mb'),
             'precision': (f"{record['runtime']} {record['precision']}" if 'runtime' in record
                           else None),
             'others': ' '.join(f'{n} {record[n + "_ms"]:.1f}' for n in other_steps(record))
             or None}.get(column, record.get(column))
    if value is None:
        return '-'
    if column == 'shape':
        return 'x'.join(map(str, value))
    if column == 'flags':
        return ' '.join(value) if value else '-'
    if isinstance(value, float):
        return f'{value:.2e}' if column in ('max_abs_diff', 'rel_err_vs_fp32') else f'{value:.2f}'
    return str(value)


def format_table(records: List[dict]) -> str:
    """Aligned text table: baseline and ours (the candidate) of each record, other steps in
    'others', '-' where a record has no value."""
    rows = [COLUMNS] + [[_cell(r, c) for c in COLUMNS] for r in records]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = [' | '.join(v.rjust(w) for v, w in zip(r, widths)) for r in rows]
    lines.insert(1, '-+-'.join('-' * w for w in widths))
    return '\n'.join(lines)


def case_label(record: dict) -> str:
    """'tiny 512x512 b2 train bf16' (+ runtime and precision, + mask_padding, + with_cp,
    + 'generic path' for a run with ``SWIN_RPE_BACKEND=generic``)."""
    label = (f"{record['arch']} {'x'.join(map(str, record['shape']))} b{record['batch']} "
             f"{record['mode']} {record['dtype']}")
    if 'runtime' in record:
        label += f" {record['runtime']} {record['precision']}"
    if record.get('mask_padding'):
        label += ' mask_padding'
    if record.get('tables'):
        label += f" tables {record['tables']}"
    if record.get('with_cp'):
        label += ' with_cp'
    if 'drop_path_rate' in record:
        label += f" drop path {record['drop_path_rate']:g}"
    if record.get('backend'):
        label += f" {record['backend']} path"
    return label


def is_timed(record: dict) -> bool:
    """A timed comparison (baseline, candidate, speedup), not an exact work count."""
    return record.get('kind') not in ('work', 'host', 'host-detector') and 'speedup' in record


HOST_COLUMNS = ['case', 'python calls ours / mmdet', 'x', 'trained tables x',
                'ATen ops ours / mmdet', 'x', 'thread ms ours / mmdet', 'x',
                'backbone Python calls ours / mmdet', 'backbone ATen ops ours / mmdet']


def host_rows(records: List[dict]) -> List[List[str]]:
    """One row per host record (``benchmarks/host.py``): each count ours / mmdet and the
    ratio; the backbone's own counts beside a whole model's."""
    def pair(sides, key, fmt='d'):
        if key not in sides['ours']:
            return '-'
        return f"{format(sides['ours'][key], fmt)} / {format(sides['mmdet'][key], fmt)}"

    def ratio(record, key):
        value = record['ratios'].get(key)
        return '-' if value is None else f'{value:.2f}'
    rows = []
    for r in records:
        if r.get('kind') not in ('host', 'host-detector'):
            continue
        s = r['sides']
        case = case_label(r) if r['kind'] == 'host' else f'{case_label(r)} whole model'
        rows.append([case, pair(s, 'python_calls'), ratio(r, 'python_calls'),
                     ratio(r, 'python_calls_tables_trained'), pair(s, 'aten_ops'),
                     ratio(r, 'aten_ops'), pair(s, 'thread_ms', '.2f'), ratio(r, 'thread_ms'),
                     pair(s, 'backbone_python_calls'), pair(s, 'backbone_aten_ops')])
    return rows


def format_host(records: List[dict]) -> str:
    """Aligned text table of the host records."""
    rows = [HOST_COLUMNS] + host_rows(records)
    widths = [max(len(r[i]) for r in rows) for i in range(len(HOST_COLUMNS))]
    lines = [' | '.join(v.rjust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, '-+-'.join('-' * w for w in widths))
    return '\n'.join(lines)


def _ratio(value: Optional[float], reference: Optional[float]) -> Optional[float]:
    return None if value is None or not reference else value / reference


def work_rows(record: dict, top: int = 2) -> List[dict]:
    """One row per side of a work record (the baseline: mmdet, or ``record['baseline']``;
    ours, ours_generic, then any other side): kernels (aten operators that launch work) with
    their ratio to the baseline's; product GFLOPs; MB moved outside the matrix products, MB kept
    for backward and allocator peak MB, each with its ratio to the baseline's (None where
    either is missing); the ``top`` largest kinds of the bytes outside the products as (kind,
    MB)."""
    sides = record['sides']
    baseline = record.get('baseline', 'mmdet')
    names = [n for n in (baseline,) + WORK_SIDES[1:] if n in sides] + \
        [n for n in sides if n not in (baseline,) + WORK_SIDES[1:]]
    ref = sides.get(baseline, {})
    rows = []
    for name in names:
        side = sides[name]
        row = dict(case=case_label(record), side=name,
                   product_gflops=side['product_flops'] / 1e9, kernels=side.get('kernels'),
                   kernels_ratio=_ratio(side.get('kernels'), ref.get('kernels')))
        for field, key in (('outside', 'bytes_outside'), ('saved', 'saved_bytes'),
                           ('peak', 'peak_bytes')):
            value = side.get(key)
            row[f'{field}_mb'] = None if value is None else value / MB
            row[f'{field}_ratio'] = _ratio(value, ref.get(key))
        kinds = sorted((side.get('bytes_by_kind') or {}).items(), key=lambda kv: (-kv[1], kv[0]))
        row['largest'] = [(kind, n / MB) for kind, n in kinds[:top]]
        rows.append(row)
    return rows


def format_profile(record: dict) -> str:
    """Side-by-side top operators of the profiled steps of one record."""
    names = list(record['profile'])
    lines = [case_label(record), '   | '.join(f'{n:<48} share' for n in names)]
    tables = [record['profile'][n] for n in names]
    for i in range(max(len(t) for t in tables)):
        cells = [f"{rows[i]['op'][:48]:<48} {rows[i]['share']:5.1%}" if i < len(rows)
                 else ' ' * 54 for rows in tables]
        lines.append('   | '.join(cells))
    for name, rows in zip(names, tables):  # the cast share the bf16 work is judged by
        copy = sum(r['share'] for r in rows if r['op'] == 'aten::copy_')
        lines.append(f'{name}: aten::copy_ {copy:.1%} of self CPU time')
    return '\n'.join(lines)


def format_work(records: List[dict]) -> str:
    """Aligned text table of the work records' rows (as the report's work table)."""
    def num(value, fmt):
        return '-' if value is None else format(value, fmt)
    rows = [['case', 'side', 'kernels', 'x base', 'GFLOPs', 'MB outside', 'x base',
             'MB saved', 'x base', 'MB peak', 'x base', 'largest kinds (MB)']]
    for record in records:
        for w in work_rows(record):
            rows.append([w['case'], w['side'], num(w['kernels'], 'd'),
                         num(w['kernels_ratio'], '.2f'), f"{w['product_gflops']:.2f}",
                         num(w['outside_mb'], '.1f'), num(w['outside_ratio'], '.2f'),
                         num(w['saved_mb'], '.1f'), num(w['saved_ratio'], '.2f'),
                         num(w['peak_mb'], '.1f'), num(w['peak_ratio'], '.2f'),
                         ', '.join(f'{k}: {mb:.1f}' for k, mb in w['largest']) or '-'])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [' | '.join(v.rjust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, '-+-'.join('-' * w for w in widths))
    return '\n'.join(lines)
