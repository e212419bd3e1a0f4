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
from mmengine.logging import print_log
from mmengine.runner import Runner

from .config import (CheckpointMismatchError, MissingPathError, UsageError, adapt_to_device,
                     check_backbone_arguments, check_data_paths, check_pretrained_paths,
                     load_config, set_data_root, toolkit_of)
from ..models.load_hooks import BIAS_TABLE, square_window_of_rows
from .pictures import PredictionPicturesHook


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
            launcher: str, mode: str, data_root: Optional[str] = None) -> Config:
    """Load and check a config and fit it to this machine; ``mode`` is 'train' or 'test'."""
    cfg = load_config(config, cfg_options, work_dir)
    if data_root is not None:
        if not osp.isdir(data_root):
            raise MissingPathError(f'--data-root: directory not found: {data_root!r}')
        set_data_root(cfg, data_root)
    if mode == 'train':
        loaders = ('train_dataloader',) + (('val_dataloader',) if cfg.get('val_cfg') else ())
    else:
        loaders = ('test_dataloader',)
    cfg.launcher = launcher
    toolkit_of(cfg)
    check_backbone_arguments(cfg)
    check_data_paths(cfg, loaders)
    if mode == 'train':
        check_pretrained_paths(cfg)
    adapt_to_device(cfg, launcher)
    if launcher != 'none':
        seed_ranks_apart(cfg)
    allow_checkpoints()
    init_distributed(launcher)
    return cfg


def seed_ranks_apart(cfg: Config) -> None:
    """Seed rank r with seed + r (mmengine's ``randomness.diff_rank_seed``) unless the config
    says otherwise: with one seed on every rank, each GPU drops the same images' branches
    (drop path) and, without dataloader workers, flips the same images, so a run of n
    processes draws like a run of 1. The data order stays one (the sampler's seed is drawn on
    rank 0 from the seeded stream and broadcast), the run reproducible from its seed."""
    randomness = cfg.setdefault('randomness', {})
    if 'diff_rank_seed' not in randomness:
        randomness['diff_rank_seed'] = True
        print_log('distributed run: each rank seeded apart (randomness.diff_rank_seed=True; '
                  'set it to False for one seed on every rank)', logger='current')


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
          launcher: str = 'none', amp_dtype: Optional[str] = None,
          data_root: Optional[str] = None) -> Runner:
    """Train as mmdet's/mmseg's tools/train.py; ``resume`` is 'auto' or a checkpoint path.

    ``load_from`` a checkpoint of another window fine-tunes at the config's window (bias tables
    are resized on load); ``resume`` from one is refused (its optimizer state has the old
    shapes, and a resumed run is meant to continue the same run).
    """
    cfg = prepare(config, work_dir, cfg_options, launcher, 'train', data_root)
    if amp:
        use_amp(cfg, amp_dtype)
    elif amp_dtype is not None:
        raise UsageError('--amp-dtype needs --amp')
    if resume == 'auto':
        cfg.resume, cfg.load_from = True, None
    elif resume is not None:
        if not (osp.isfile(resume) or is_sharded_checkpoint(resume)):
            raise MissingPathError(f'--resume: checkpoint not found: {resume!r} (a file, or '
                                   'the folder of rank*.pth files a sharded run saves)')
        cfg.resume, cfg.load_from = True, resume
    if cfg.get('load_from') and not (osp.isfile(cfg.load_from)
                                     or is_sharded_checkpoint(cfg.load_from)):
        raise MissingPathError(f'load_from: checkpoint not found: {cfg.load_from!r}')
    runner = build_runner(cfg)
    if cfg.get('resume'):
        from mmengine.runner import find_latest_checkpoint
        path = cfg.get('load_from') or find_latest_checkpoint(cfg.work_dir)
        if path and not is_sharded_checkpoint(path):  # shards: the strategy checks shapes
            check_resume_window(runner.model, path)
    runner.train()
    return runner


def is_sharded_checkpoint(path: str) -> bool:
    """Whether ``path`` is the folder of per-rank files FSDPStrategy saves with
    ``state_dict_cfg='local'`` (``iter_N.pth/rank{r}.pth``)."""
    return osp.isfile(osp.join(path, 'rank0.pth'))


def _read_state(path: str) -> Dict[str, torch.Tensor]:
    from mmengine.runner.checkpoint import _load_checkpoint
    ckpt = _load_checkpoint(path, map_location='cpu')
    state = ckpt.get('state_dict', ckpt) if isinstance(ckpt, dict) else {}
    return {k[len('module.'):] if k.startswith('module.') else k: v for k, v in state.items()}


def _own_state(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    return (model.module if hasattr(model, 'module') else model).state_dict()


def _resized_on_load(key: str, saved: tuple, own: tuple) -> bool:
    """Whether the backbone's load hook resizes this saved bias table to the model's."""
    return (key.endswith(BIAS_TABLE) and len(saved) == len(own) == 2 and saved[1] == own[1]
            and square_window_of_rows(saved[0]) is not None)


def check_resume_window(model: torch.nn.Module, path: str) -> None:
    """Raise UsageError when ``path`` holds bias tables of another window than the model's."""
    state, own = _read_state(path), _own_state(model)
    other = [k for k in own if k.endswith(BIAS_TABLE) and k in state
             and tuple(state[k].shape) != tuple(own[k].shape)]
    if other:
        k = other[0]
        raise UsageError(
            f'--resume: {path!r} was trained at another window ({k}: {tuple(state[k].shape)} '
            f'in the checkpoint, {tuple(own[k].shape)} in the model; {len(other)} such tables). '
            'A resumed run continues the same run, optimizer state included, so the window must '
            'match; to fine-tune at the new window start a new run from it: '
            f'--cfg-options load_from={path} (bias tables are resized on load)')


def check_checkpoint_fits(model: torch.nn.Module, path: str) -> None:
    """Raise CheckpointMismatchError naming the first key that is missing, extra or misshapen.

    Bias tables of another (square) window are not a mismatch: the backbone resizes them.
    """
    state, own = _read_state(path), _own_state(model)
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    misshapen = [k for k in own if k in state and tuple(own[k].shape) != tuple(state[k].shape)
                 and not _resized_on_load(k, tuple(state[k].shape), tuple(own[k].shape))]
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


def test(config: str, checkpoint: str, work_dir: Optional[str] = None,
         cfg_options: Optional[dict] = None, show_dir: Optional[str] = None,
         launcher: str = 'none', metrics_out: Optional[str] = None,
         data_root: Optional[str] = None, show_interval: int = 1) -> Dict[str, float]:
    """Evaluate ``checkpoint`` as mmdet's/mmseg's tools/test.py; return the metrics.

    ``show_dir``: a picture of ground truth and prediction for every ``show_interval``-th
    image, drawn by the toolkit's visualizer.
    """
    if not osp.isfile(checkpoint):
        raise MissingPathError(f'CHECKPOINT: checkpoint not found: {checkpoint!r}')
    if show_interval < 1:
        raise UsageError(f'--show-interval must be >= 1, got {show_interval}')
    cfg = prepare(config, work_dir, cfg_options, launcher, 'test', data_root)
    cfg.load_from = checkpoint
    runner = build_runner(cfg)
    if show_dir:
        runner.register_hook(PredictionPicturesHook(show_dir, show_interval), 'LOW')
    check_checkpoint_fits(runner.model, checkpoint)
    metrics = runner.test()
    metrics = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
    if metrics_out and runner.rank == 0:
        os.makedirs(osp.dirname(osp.abspath(metrics_out)), exist_ok=True)
        with open(metrics_out, 'w') as f:
            json.dump(metrics, f, indent=1)
    return metrics
