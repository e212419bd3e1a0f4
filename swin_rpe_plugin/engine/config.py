"""Prepare an mmdet or mmseg config for tools/train.py and tools/test.py.

The steps of mmdet's and mmseg's own tools (load, merge ``--cfg-options``, work dir, AMP,
resume), plus what this machine needs: SyncBN -> BN and gloo without CUDA, and early checks
that turn a missing data root or an unknown backbone argument into one clear error.
"""
import importlib
import inspect
import os
import os.path as osp
from typing import Any, Iterator, List, Optional, Tuple

import torch
from mmengine.config import Config
from mmengine.logging import print_log

TOOLKITS = ('mmdet', 'mmseg')


class UsageError(Exception):
    """Base of the errors the tools print as one line (bad path, argument or key)."""


class MissingPathError(UsageError, FileNotFoundError):
    """A config, data root, annotation file or checkpoint that does not exist."""


class ConfigArgumentError(UsageError, TypeError):
    """A config names an argument that the class it builds does not take."""


class CheckpointMismatchError(UsageError, ValueError):
    """A checkpoint whose keys or shapes do not fit the model."""


def load_config(path: str, cfg_options: Optional[dict] = None,
                work_dir: Optional[str] = None) -> Config:
    """Read ``path``, merge options, set ``work_dir`` (CLI > config > ./work_dirs/<name>)."""
    if not osp.isfile(path):
        raise MissingPathError(f'config file not found: {path!r}')
    cfg = Config.fromfile(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(path))[0])
    return cfg


def toolkit_of(cfg: Config) -> str:
    """'mmdet' or 'mmseg', from the config's ``default_scope``."""
    scope = cfg.get('default_scope')
    if scope not in TOOLKITS:
        raise ValueError(f'default_scope must be one of {TOOLKITS} (set by the base '
                         f"config's default_runtime), got {scope!r}")
    return scope


def _walk(node: Any, path: str = '') -> Iterator[Tuple[str, dict]]:
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f'{path}.{key}' if path else str(key))
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _walk(value, f'{path}[{i}]')


def sync_bn_to_bn(cfg: Config) -> List[str]:
    """Rewrite every ``dict(type='SyncBN')`` under ``cfg.model`` to BN; return the paths."""
    changed = []
    for path, node in _walk(cfg.model, 'model'):
        if node.get('type') in ('SyncBN', 'MMSyncBN'):
            node['type'] = 'BN'
            changed.append(path)
    return changed


def adapt_to_device(cfg: Config, launcher: str = 'none') -> None:
    """Without CUDA: SyncBN -> BN (logged), gloo for distributed runs, DDP on CPU."""
    if torch.cuda.is_available():
        return
    changed = sync_bn_to_bn(cfg)
    if changed:
        print_log(f'no CUDA device: SyncBN converted to BN in {", ".join(changed)}',
                  logger='current')
    cfg.setdefault('env_cfg', {}).setdefault('dist_cfg', {})['backend'] = 'gloo'
    if launcher != 'none':
        # mmengine passes device_ids=[LOCAL_RANK] to DDP, which a CPU module refuses.
        wrapper = cfg.get('model_wrapper_cfg') or dict(type='MMDistributedDataParallel')
        wrapper['device_ids'] = None
        cfg.model_wrapper_cfg = wrapper


def _dataset_cfgs(cfg: Config) -> Iterator[Tuple[str, dict]]:
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        dataset = (cfg.get(loader) or {}).get('dataset')
        path = f'{loader}.dataset'
        while isinstance(dataset, dict) and isinstance(dataset.get('dataset'), dict):
            dataset, path = dataset['dataset'], f'{path}.dataset'  # Repeat/ClassBalanced
        if isinstance(dataset, dict):
            yield path, dataset


def check_data_paths(cfg: Config, loaders: Tuple[str, ...]) -> None:
    """Raise MissingPathError naming the key and path of a missing data root or file."""
    for key, dataset in _dataset_cfgs(cfg):
        if not key.startswith(loaders):
            continue
        root = dataset.get('data_root') or ''
        if root and not osp.isdir(root):
            raise MissingPathError(
                f'{key}.data_root: directory not found: {root!r} (for the synthetic sets run '
                'tools/make_synthetic_data.py, or set it with --cfg-options)')
        ann = dataset.get('ann_file')
        if ann and not osp.isfile(osp.join(root, ann)):
            raise MissingPathError(f'{key}.ann_file: file not found: {osp.join(root, ann)!r}')
        for name, prefix in (dataset.get('data_prefix') or {}).items():
            if prefix and not osp.isdir(osp.join(root, prefix)):
                raise MissingPathError(
                    f'{key}.data_prefix.{name}: directory not found: {osp.join(root, prefix)!r}')


def check_backbone_arguments(cfg: Config) -> None:
    """Raise ConfigArgumentError naming an argument the backbone class does not take."""
    backbone = cfg.model.get('backbone')
    if not isinstance(backbone, dict) or not isinstance(backbone.get('type'), str):
        return
    registry = importlib.import_module(f'{toolkit_of(cfg)}.registry').MODELS
    cls = registry.get(backbone['type'])
    if cls is None:
        raise ConfigArgumentError(f'model.backbone.type: {backbone["type"]!r} is not registered '
                                  '(is its package in custom_imports?)')
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(k for k in backbone if k not in params and k not in ('type', '_delete_'))
    if unknown:
        raise ConfigArgumentError(
            f'model.backbone: {cls.__name__} takes no argument {unknown[0]!r}'
            + (f' (also unknown: {unknown[1:]})' if unknown[1:] else '')
            + f'; it takes {[k for k in params if k != "self"]}')
