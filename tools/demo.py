"""The end-to-end job on synthetic data: generate, evaluate, fine-tune, evaluate, benchmark, report.

    .venv/bin/python tools/demo.py [--out work_dirs/demo] [--data data/synthetic] [--jobs 2]

1. tools/make_synthetic_data.py's sets (COCO-format instances, ADE20K-format semantic).
2. For the tiny Swin Mask R-CNN and UperNet of configs/synthetic/: save the initial weights,
   evaluate them with tools/test.py ("before"), fine-tune from them with tools/train.py
   (``load_from``), evaluate the result with tools/test.py ("after", with --show-dir pictures).
   The two tasks run side by side (--jobs 2), one thread each.
3. tools/benchmark.py --quick, when that tool is present (skip it with --no-benchmark).
4. <out>/metrics.json, <out>/demo.png (loss curves, metrics, and ground truth against
   predictions on validation images), a summary table on stdout.
Logs, checkpoints and pictures are under <out>/det and <out>/seg.
"""
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from tqdm import tqdm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from swin_rpe_plugin.cli import ArgumentParser  # noqa: E402
from swin_rpe_plugin.datasets import make_synthetic_data  # noqa: E402
from swin_rpe_plugin.engine.demo import (METRIC_KEYS, loss_curve, options_argv,  # noqa: E402
                                         plot_results, prediction_pictures, read_scalars,
                                         save_initial_checkpoint, summary_table,
                                         synthetic_options, synthetic_root)

PY = sys.executable
TASKS = {  # name: (config, toolkit, metrics it reports)
    'det': ('configs/synthetic/mask-rcnn_swin-rpe-tiny_fpn_shapes.py', 'mmdet',
            ('bbox_mAP', 'segm_mAP')),
    'seg': ('configs/synthetic/upernet_swin-rpe-tiny_shapes-128x128.py', 'mmseg', ('mIoU',)),
}
TASKS_V2 = {  # --arch v2: the same recipes with a tiny SwinV2 backbone
    'det': ('configs/synthetic/mask-rcnn_swinv2-tiny_fpn_shapes.py', 'mmdet',
            ('bbox_mAP', 'segm_mAP')),
    'seg': ('configs/synthetic/upernet_swinv2-tiny_shapes-128x128.py', 'mmseg', ('mIoU',)),
}
ITER = re.compile(r'Iter\(train\) \[\s*(\d+)/(\d+)\]')
NO_VAL = {'val_cfg': None, 'val_dataloader': None, 'val_evaluator': None}  # test.py evaluates


def run(cmd, log_path, env, bar=None) -> float:
    """Run ``cmd``, stream its output to ``log_path`` (and training progress to ``bar``)."""
    start = time.time()
    with open(log_path, 'w') as log, subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True) as proc:
        for line in proc.stdout:
            log.write(line)
            match = ITER.search(line) if bar is not None else None
            if match:
                bar.total = int(match.group(2))
                bar.n = int(match.group(1))
                bar.refresh()
    if proc.returncode:
        with open(log_path) as f:
            tail = ''.join(f.readlines()[-15:])
        raise RuntimeError(f'{" ".join(cmd[1:3])} failed ({proc.returncode}); see {log_path}:'
                           f'\n{tail}')
    return time.time() - start


def run_task(name, init, out, data, threads, position, max_iters=None, tasks=TASKS):
    config, toolkit, _ = tasks[name]
    work = os.path.join(out, name)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    root = ['--data-root', synthetic_root(toolkit, data)]
    warmup = max(1, (max_iters or 0) // 4)
    schedule = {} if max_iters is None else {  # a shorter run, warm-up then decay
        'train_cfg.max_iters': max_iters, 'param_scheduler.0.end': warmup,
        'param_scheduler.1.begin': warmup, 'param_scheduler.1.end': max_iters,
        'default_hooks.checkpoint.interval': max_iters}
    times = {}
    test = [PY, 'tools/test.py', config]
    times[f'{name} test before'] = run(
        test + [init, '--work-dir', os.path.join(work, 'test_before'), '--out-metrics',
                os.path.join(work, 'metrics_before.json')] + root,
        os.path.join(work, 'test_before.log'), env)
    with tqdm(desc=f'{name} train', position=position, unit='it', leave=True) as bar:
        times[f'{name} train'] = run(
            [PY, 'tools/train.py', config, '--work-dir', os.path.join(work, 'train')]
            + root + options_argv({**NO_VAL, **schedule, 'load_from': init}),
            os.path.join(work, 'train.log'), env, bar)
    with open(os.path.join(work, 'train', 'last_checkpoint')) as f:
        checkpoint = f.read().strip()
    times[f'{name} test after'] = run(
        test + [checkpoint, '--work-dir', os.path.join(work, 'test_after'), '--out-metrics',
                os.path.join(work, 'metrics_after.json'), '--show-dir',
                os.path.join(work, 'predictions')] + root,
        os.path.join(work, 'test_after.log'), env)
    return times


def main(argv=None) -> int:
    parser = ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--out', default='work_dirs/demo')
    parser.add_argument('--data', default='data/synthetic')
    parser.add_argument('--num-train', type=int, default=200)
    parser.add_argument('--num-val', type=int, default=50)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--jobs', type=int, choices=(1, 2), default=2,
                        help='run detection and segmentation side by side (2) or in turn (1)')
    parser.add_argument('--no-benchmark', action='store_true',
                        help='skip tools/benchmark.py --quick (make demo ARGS=--no-benchmark)')
    parser.add_argument('--max-iters', type=int,
                        help="override the configs' schedule length (for a quick look)")
    parser.add_argument('--arch', choices=('v1', 'v2'), default='v1',
                        help='backbone of the tiny models: Swin (v1, default) or SwinV2 (v2)')
    args = parser.parse_args(argv)
    tasks = TASKS if args.arch == 'v1' else TASKS_V2
    out, data = os.path.abspath(args.out), os.path.abspath(args.data)
    start = time.time()
    times = {}

    print(f'[1/4] synthetic data -> {data}')
    t = time.time()
    make_synthetic_data(data, args.num_train, args.num_val, args.seed)
    times['data'] = time.time() - t

    print('[2/4] initial weights, evaluate, fine-tune, evaluate (logs under '
          f'{out}/det, {out}/seg)')
    inits = {}
    for name, (config, toolkit, _) in tasks.items():
        os.makedirs(os.path.join(out, name), exist_ok=True)
        inits[name] = save_initial_checkpoint(
            os.path.join(ROOT, config), os.path.join(out, name, 'init.pth'), args.seed,
            synthetic_options(toolkit, data))
    threads = 1 if args.jobs == 2 else max(1, os.cpu_count() or 1)
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_task, name, inits[name], out, data, threads, i,
                               args.max_iters, tasks)
                   for i, name in enumerate(tasks)]
        for future in futures:
            times.update(future.result())

    print('[3/4] benchmark')
    bench = os.path.join(ROOT, 'tools', 'benchmark.py')
    if args.no_benchmark:
        print('skipped (--no-benchmark)')
    elif os.path.isfile(bench):
        times['benchmark --quick'] = run(
            # bf16 lines only where the CPU's bf16 matmul is fast; the tool says why otherwise.
            [PY, bench, '--quick', '--dtype', 'fp32', '--dtype', 'bf16', '--json',
             os.path.join(out, 'benchmark.json')],
            os.path.join(out, 'benchmark.log'), dict(os.environ))
        with open(os.path.join(out, 'benchmark.log')) as f:
            print(''.join(f.readlines()[-12:]))
    else:
        print('note: tools/benchmark.py is not in this checkout yet; benchmark skipped')

    print('[4/4] report')
    metrics, curves = {}, {}
    for name, (_, _, names) in tasks.items():
        results = {}
        for when in ('before', 'after'):
            with open(os.path.join(out, name, f'metrics_{when}.json')) as f:
                results[when] = json.load(f)
        for metric in names:
            metrics[metric] = {w: results[w][METRIC_KEYS[metric]] for w in results}
        curves[name] = loss_curve(read_scalars(os.path.join(out, name, 'train')))
    times['total'] = time.time() - start
    with open(os.path.join(out, 'metrics.json'), 'w') as f:
        json.dump(dict(metrics, wall_time_s=times), f, indent=1)
    pictures = {name: prediction_pictures(os.path.join(out, name, 'predictions'), 2)
                for name in TASKS}
    plot_results(curves, metrics, os.path.join(out, 'demo.png'), pictures)
    print(f'wrote {out}/metrics.json, {out}/demo.png')
    print(summary_table(metrics, times))
    return 0


if __name__ == '__main__':
    sys.exit(main())
