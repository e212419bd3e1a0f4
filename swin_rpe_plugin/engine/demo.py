"""The end-to-end demo's parts: data options, the starting checkpoint, results, plot and table.

tools/demo.py strings them together with tools/train.py and tools/test.py run as subprocesses,
exactly as a user would run them.
"""
import importlib
import json
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence

import torch

from .config import adapt_to_device, load_config, toolkit_of

# The metric each task reports in metrics.json, and the runner's key for it.
METRIC_KEYS = {'bbox_mAP': 'coco/bbox_mAP', 'segm_mAP': 'coco/segm_mAP', 'mIoU': 'mIoU'}


SYNTHETIC_DIRS = {'mmdet': 'coco', 'mmseg': 'ade'}  # where make_synthetic_data writes each set


def synthetic_root(toolkit: str, root: str) -> str:
    """The ``--data-root`` of a toolkit's synthetic set under ``root``."""
    if toolkit not in SYNTHETIC_DIRS:
        raise ValueError(f'toolkit must be mmdet or mmseg, got {toolkit!r}')
    return osp.join(root, SYNTHETIC_DIRS[toolkit])


def synthetic_options(toolkit: str, root: str) -> Dict[str, str]:
    """``--cfg-options`` pointing a configs/synthetic config at the set under ``root``."""
    loaders = ('train_dataloader', 'val_dataloader', 'test_dataloader')
    if toolkit == 'mmdet':
        data_root = osp.join(root, 'coco') + '/'
        ann = osp.join(data_root, 'annotations', 'instances_val.json')
        options = {f'{k}.dataset.data_root': data_root for k in loaders}
        options.update({'val_evaluator.ann_file': ann, 'test_evaluator.ann_file': ann})
        return options
    if toolkit == 'mmseg':
        return {f'{k}.dataset.data_root': osp.join(root, 'ade') for k in loaders}
    raise ValueError(f'toolkit must be mmdet or mmseg, got {toolkit!r}')


def options_argv(options: Dict[str, object]) -> List[str]:
    """A dict of options as ``--cfg-options`` arguments (None -> 'None')."""
    return ['--cfg-options'] + [f'{k}={v}' for k, v in options.items()] if options else []


def save_initial_checkpoint(config: str, path: str, seed: int = 0,
                            cfg_options: Optional[dict] = None) -> str:
    """Build the config's model, initialise it as training does, save its state dict.

    The demo evaluates this checkpoint ("before") and fine-tunes from it (``load_from``), so
    the two numbers compare the same weights before and after training.
    """
    from mmengine.logging import MMLogger
    from mmengine.registry import init_default_scope
    from mmengine.runner import set_random_seed
    # init_weights reports every parameter at INFO: a quiet logger becomes the current one.
    MMLogger.get_instance(f'init:{osp.abspath(path)}', log_level='WARNING')
    cfg = load_config(config, cfg_options)
    adapt_to_device(cfg)
    init_default_scope(toolkit_of(cfg))
    set_random_seed(seed)
    model = importlib.import_module(f'{cfg.default_scope}.registry').MODELS.build(cfg.model)
    model.init_weights()
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    torch.save({'state_dict': model.state_dict(), 'meta': {'seed': seed}}, path)
    return path


def read_scalars(work_dir: str) -> List[dict]:
    """The training log records (``vis_data/scalars.json`` of the latest run in ``work_dir``)."""
    runs = sorted(d for d in os.listdir(work_dir) if osp.isfile(
        osp.join(work_dir, d, 'vis_data', 'scalars.json')))
    if not runs:
        raise FileNotFoundError(f'no vis_data/scalars.json under {work_dir!r}')
    with open(osp.join(work_dir, runs[-1], 'vis_data', 'scalars.json')) as f:
        return [json.loads(line) for line in f if line.strip()]


def loss_curve(records: Sequence[dict]) -> List[tuple]:
    """(iteration, loss) of every training record."""
    return [(r['iter'], r['loss']) for r in records if 'loss' in r and 'iter' in r]


def prediction_pictures(folder: str, count: int) -> List[str]:
    """The first ``count`` pictures (sorted by name) that tools/test.py --show-dir wrote."""
    if not osp.isdir(folder):
        return []
    return [osp.join(folder, f) for f in sorted(os.listdir(folder)) if f.endswith('.png')][:count]


def plot_results(curves: Dict[str, List[tuple]], metrics: Dict[str, dict], path: str,
                 pictures: Optional[Dict[str, List[str]]] = None) -> str:
    """One PNG: a loss curve per task and the metrics before and after training; below them,
    when ``pictures`` ({task: [png, ...]}) are given, the test tool's pictures of ground truth
    (left half) against prediction (right half), one panel each."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    panels = [(task, p) for task, paths in (pictures or {}).items() for p in paths]
    cols = len(curves) + 1
    pic_rows = -(-len(panels) // 2) if panels else 0
    fig = plt.figure(figsize=(5 * cols, 4 + 3.2 * pic_rows))
    grid = fig.add_gridspec(1 + pic_rows, 2 * cols, height_ratios=[4] + [3.2] * pic_rows)
    axes = [fig.add_subplot(grid[0, 2 * i:2 * i + 2]) for i in range(cols)]
    for ax, (name, curve) in zip(axes, curves.items()):
        if curve:
            ax.plot(*zip(*curve), marker='.')
        ax.set(title=f'{name}: training loss', xlabel='iteration', ylabel='loss')
        ax.grid(alpha=0.3)
    ax = axes[-1]
    names = list(metrics)
    # mAPs are on mmdet's 0-1 scale, mIoU on mmseg's percent scale: plot both in percent.
    scale = [100 if n != 'mIoU' else 1 for n in names]
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], [metrics[n]['before'] * s for n, s in zip(names, scale)],
           width=0.4, label='before')
    ax.bar([i + 0.2 for i in x], [metrics[n]['after'] * s for n, s in zip(names, scale)],
           width=0.4, label='after')
    ax.set_xticks(list(x), names)
    ax.set(title='synthetic val set', ylabel='percent')
    ax.legend()
    half = cols  # two pictures per row, each half the figure wide
    for i, (task, picture) in enumerate(panels):
        row, col = 1 + i // 2, (i % 2) * half
        pax = fig.add_subplot(grid[row, col:col + half])
        pax.imshow(plt.imread(picture))
        pax.set_title(f'{task} {osp.basename(picture)}: ground truth | prediction', fontsize=9)
        pax.axis('off')
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def summary_table(metrics: Dict[str, dict], times: Dict[str, float]) -> str:
    """The closing table: each metric before/after training, then wall times."""
    lines = [f'{"metric":<10} {"before":>8} {"after":>8}  scale']
    for name, m in metrics.items():
        scale = 'percent' if name == 'mIoU' else '0-1'
        lines.append(f'{name:<10} {m["before"]:>8.3f} {m["after"]:>8.3f}  {scale}')
    lines.append('')
    lines.append(f'{"stage":<24} {"wall s":>8}')
    lines += [f'{k:<24} {v:>8.1f}' for k, v in times.items()]
    width = max(len(line) for line in lines)
    return '\n'.join(['-' * width] + lines + ['-' * width])
