"""Train and test through mmengine's Runner, as mmdet's and mmseg's tools/train.py and test.py do.

The CLIs in tools/ parse arguments and call :func:`train` / :func:`test`; everything here works
for detection and segmentation configs alike (the toolkit comes from ``default_scope``).
"""
import json
import os
import os.path as osp
from typing import Dict, Optional

import torch
import torch.distributed as torch_dist
from mmengine.config import Config
from mmengine.runner import Runner

from .config import (CheckpointMismatchError, MissingPathError, UsageError, adapt_to_device,
                     check_backbone_arguments, check_data_paths, load_config, toolkit_of)


def allow_checkpoints() -> bool:
    """Let ``torch.load(weights_only=True)`` read mmengine checkpoints, if the shim is in.

    torch >= 2.6 loads with ``weights_only=True`` by default and refuses what mmengine stores
    next to the weights (numpy values in ``meta``, ``HistoryBuffer`` in ``message_hub``). The
    allow-list lives in one place, ``swin_rpe_plugin.checkpoint.compat``.
    """
    try:
        from swin_rpe_plugin.checkpoint.compat import allow_mmengine_checkpoints
    except ImportError:
        return False
    allow_mmengine_checkpoints()
    return True


def init_distributed(launcher: str) -> None:
    """Start the process group on CPU ourselves: mmengine's ``init_dist`` calls
    ``torch.cuda.set_device``, which a CPU-only torch refuses. On GPU mmengine does it."""
    if launcher == 'none' or torch.cuda.is_available() or torch_dist.is_initialized():
        return
    if launcher != 'pytorch':
        raise UsageError(f'--launcher {launcher!r} on CPU: only "pytorch" (torchrun) is '
                         'supported without CUDA')
    torch_dist.init_process_group(backend='gloo')


def build_runner(cfg: Config) -> Runner:
    if 'runner_type' in cfg:
        from mmengine.registry import RUNNERS
        return RUNNERS.build(cfg)
    return Runner.from_cfg(cfg)


def prepare(config: str, work_dir: Optional[str], cfg_options: Optional[dict],
            launcher: str, mode: str) -> Config:
    """Load and check a config and fit it to this machine; ``mode`` is 'train' or 'test'."""
    cfg = load_config(config, cfg_options, work_dir)
    if mode == 'train':
        loaders = ('train_dataloader',) + (('val_dataloader',) if cfg.get('val_cfg') else ())
    else:
        loaders = ('test_dataloader',)
    cfg.launcher = launcher
    toolkit_of(cfg)
    check_backbone_arguments(cfg)
    check_data_paths(cfg, loaders)
    adapt_to_device(cfg, launcher)
    allow_checkpoints()
    init_distributed(launcher)
    return cfg


AMP_DTYPES = ('bf16', 'fp16')


def use_amp(cfg: Config, dtype: Optional[str] = None) -> None:
    """Switch ``cfg.optim_wrapper`` to mixed precision, as ``--amp [--amp-dtype]`` asks.

    CUDA: mmengine's ``AmpOptimWrapper``, fp16 with a dynamic loss scale (bf16 if asked).
    CPU: ``swin_rpe_plugin.AutocastOptimWrapper``, bf16 autocast, no loss scale needed.
    Weights, gradients and checkpoints stay float32 either way.
    """
    if dtype not in (None,) + AMP_DTYPES:
        raise UsageError(f'--amp-dtype {dtype!r}: choose one of {AMP_DTYPES}')
    wrapper = cfg.optim_wrapper
    if torch.cuda.is_available():
        wrapper.type = 'AmpOptimWrapper'
        wrapper.dtype = 'bfloat16' if dtype == 'bf16' else 'float16'
        wrapper.setdefault('loss_scale', 'dynamic')
        return
    if dtype == 'fp16':
        raise UsageError('--amp-dtype fp16 needs CUDA (fp16 trains with a loss scale); on CPU '
                         'use --amp-dtype bf16 (the default there)')
    wrapper.type = 'swin_rpe_plugin.AutocastOptimWrapper'
    wrapper.dtype = 'bfloat16'
    wrapper.pop('loss_scale', None)
    if toolkit_of(cfg) == 'mmdet':
        # mmcv's CPU nms and RoIAlign have no bf16 kernels: the heads stay float32.
        wrapper.autocast_modules = [m for m in ('backbone', 'neck') if m in cfg.model]


def train(config: str, work_dir: Optional[str] = None, cfg_options: Optional[dict] = None,
          resume: Optional[str] = None, amp: bool = False,
          launcher: str = 'none', amp_dtype: Optional[str] = None) -> Runner:
    """Train as mmdet's/mmseg's tools/train.py; ``resume`` is 'auto' or a checkpoint path."""
    cfg = prepare(config, work_dir, cfg_options, launcher, 'train')
    if amp:
        use_amp(cfg, amp_dtype)
    elif amp_dtype is not None:
        raise UsageError('--amp-dtype needs --amp')
    if resume == 'auto':
        cfg.resume, cfg.load_from = True, None
    elif resume is not None:
        if not osp.isfile(resume):
            raise MissingPathError(f'--resume: checkpoint not found: {resume!r}')
        cfg.resume, cfg.load_from = True, resume
    if cfg.get('load_from') and not osp.isfile(cfg.load_from):
        raise MissingPathError(f'load_from: checkpoint not found: {cfg.load_from!r}')
    runner = build_runner(cfg)
    runner.train()
    return runner


def check_checkpoint_fits(model: torch.nn.Module, path: str) -> None:
    """Raise CheckpointMismatchError naming the first key that is missing, extra or misshapen."""
    from mmengine.runner.checkpoint import _load_checkpoint
    ckpt = _load_checkpoint(path, map_location='cpu')
    state = ckpt.get('state_dict', ckpt) if isinstance(ckpt, dict) else {}
    state = {k[len('module.'):] if k.startswith('module.') else k: v for k, v in state.items()}
    own = (model.module if hasattr(model, 'module') else model).state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    misshapen = [k for k in own if k in state and tuple(own[k].shape) != tuple(state[k].shape)]
    if misshapen:
        k = misshapen[0]
        raise CheckpointMismatchError(
            f'checkpoint {path!r} does not fit the model: {k} has shape '
            f'{tuple(state[k].shape)} in the checkpoint, {tuple(own[k].shape)} in the model '
            f'({len(misshapen)} such keys)')
    if missing or unexpected:
        raise CheckpointMismatchError(
            f'checkpoint {path!r} does not fit the model: {len(missing)} model keys missing '
            f'(first: {missing[:3]}), {len(unexpected)} unexpected (first: {unexpected[:3]})')


def show_predictions(cfg: Config, show_dir: str) -> None:
    """Turn on the toolkit's visualization hook and write pictures to ``show_dir``."""
    hook = cfg.default_hooks.get('visualization')
    if hook is None:
        raise UsageError('--show-dir needs default_hooks.visualization in the config')
    hook['draw'] = True
    if toolkit_of(cfg) == 'mmdet':
        hook['test_out_dir'] = osp.abspath(show_dir)
    else:
        cfg.visualizer['save_dir'] = osp.abspath(show_dir)


def test(config: str, checkpoint: str, work_dir: Optional[str] = None,
         cfg_options: Optional[dict] = None, show_dir: Optional[str] = None,
         launcher: str = 'none', metrics_out: Optional[str] = None) -> Dict[str, float]:
    """Evaluate ``checkpoint`` as mmdet's/mmseg's tools/test.py; return the metrics."""
    if not osp.isfile(checkpoint):
        raise MissingPathError(f'checkpoint not found: {checkpoint!r}')
    cfg = prepare(config, work_dir, cfg_options, launcher, 'test')
    cfg.load_from = checkpoint
    if show_dir:
        show_predictions(cfg, show_dir)
    runner = build_runner(cfg)
    check_checkpoint_fits(runner.model, checkpoint)
    metrics = runner.test()
    metrics = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
    if metrics_out and runner.rank == 0:
        os.makedirs(osp.dirname(osp.abspath(metrics_out)), exist_ok=True)
        with open(metrics_out, 'w') as f:
            json.dump(metrics, f, indent=1)
    return metrics
