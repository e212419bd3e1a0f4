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

from ..cli import closest

TOOLKITS = ('mmdet', 'mmseg')


class UsageError(Exception):
    """Base of the errors the tools print as one line (bad path, argument or key)."""


class MissingPathError(UsageError, FileNotFoundError):
    """A config, data root, annotation file or checkpoint that does not exist."""


class ConfigArgumentError(UsageError, TypeError):
    """A config names an argument that the class it builds does not take."""


class CheckpointMismatchError(UsageError, ValueError):
    """A checkpoint whose keys or shapes do not fit the model."""


class ConfigError(UsageError, ValueError):
    """A config file that mmengine cannot read or merge (syntax, inheritance, --cfg-options)."""


# mmengine's own messages name the key; these say what to do where the message does not.
_CONFIG_FIXES = (
    ('cannot inherit from base', ''),  # mmengine's message already says `_delete_=True`
    ('invalid syntax', 'fix the Python syntax at the line named'),
    ('is not defined', "a name the config uses is not defined: define it, or take it from the "
                       "base with {{_base_.NAME}}"),
)


def _config_error(path: str, err: Exception) -> ConfigError:
    message = ' '.join(str(err).split())  # mmengine's messages span lines
    if isinstance(err, SyntaxError) and err.lineno:
        message = f'{err.msg} (line {err.lineno} of {err.filename or path})'
    fix = next((f for key, f in _CONFIG_FIXES if key in message), 'fix the key it names')
    return ConfigError(f'config {path!r}: {type(err).__name__}: {message}'
                       + (f'; {fix}' if fix else ''))


def load_config(path: str, cfg_options: Optional[dict] = None,
                work_dir: Optional[str] = None) -> Config:
    """Read ``path``, merge options, set ``work_dir`` (CLI > config > ./work_dirs/<name>)."""
    if not osp.isfile(path):
        raise MissingPathError(f'config file not found: {path!r}')
    try:
        cfg = Config.fromfile(path)
        if cfg_options:
            cfg.merge_from_dict(cfg_options)
    except (SyntaxError, TypeError, KeyError, ValueError, NameError, AttributeError,
            ImportError, FileNotFoundError) as err:  # mmengine raises these for bad configs
        raise _config_error(path, err) from err
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
    """Without CUDA: SyncBN -> BN (logged), gloo for distributed runs, DDP and FSDP on CPU."""
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
    strategy = cfg.get('strategy')
    if isinstance(strategy, dict) and 'FSDP' in str(strategy.get('type', '')):
        # FlexibleRunner's FSDPStrategy passes device_id=LOCAL_RANK, a CUDA device.
        strategy.setdefault('model_wrapper', {})['device_id'] = 'cpu'


LOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')
EVALUATORS = {'val_evaluator': 'val_dataloader', 'test_evaluator': 'test_dataloader'}
DATA_ROOT_HINT = ('pass --data-root DIR (the folder holding the annotations and images; for the '
                  'synthetic sets, tools/make_synthetic_data.py writes DIR/coco and DIR/ade)')


def _dataset_cfgs(cfg: Config, loaders: Tuple[str, ...] = LOADERS
                  ) -> Iterator[Tuple[str, dict]]:
    for loader in loaders:
        dataset = (cfg.get(loader) or {}).get('dataset')
        path = f'{loader}.dataset'
        while isinstance(dataset, dict) and isinstance(dataset.get('dataset'), dict):
            dataset, path = dataset['dataset'], f'{path}.dataset'  # Repeat/ClassBalanced
        if isinstance(dataset, dict):
            yield path, dataset


def _evaluator_cfgs(cfg: Config, name: str) -> List[dict]:
    evaluator = cfg.get(name)
    if isinstance(evaluator, dict):
        return [evaluator]
    return [e for e in evaluator or [] if isinstance(e, dict)]


def set_data_root(cfg: Config, root: str) -> List[str]:
    """Point every dataset of the config at ``root`` (``--data-root``); return the keys set.

    Each dataset's ``data_root`` becomes ``root`` (its ``ann_file`` and ``data_prefix`` are
    relative to it, as in mmdet's COCO and mmseg's ADE20K bases); an evaluator's ``ann_file``
    (mmdet's CocoMetric) becomes ``root`` joined with the annotation file of the dataset it
    evaluates.
    """
    changed = []
    anns = {}
    for key, dataset in _dataset_cfgs(cfg):
        dataset['data_root'] = root
        changed.append(f'{key}.data_root')
        anns[key.split('.')[0]] = dataset.get('ann_file')
    for name, loader in EVALUATORS.items():
        for i, evaluator in enumerate(_evaluator_cfgs(cfg, name)):
            if evaluator.get('ann_file') and anns.get(loader):
                evaluator['ann_file'] = osp.join(root, anns[loader])
                changed.append(name + ('' if isinstance(cfg.get(name), dict) else f'[{i}]')
                               + '.ann_file')
    return changed


def check_data_paths(cfg: Config, loaders: Tuple[str, ...]) -> None:
    """Raise MissingPathError naming the key and path of a missing data root or file."""
    for key, dataset in _dataset_cfgs(cfg, loaders):
        root = dataset.get('data_root') or ''
        if root and not osp.isdir(root):
            raise MissingPathError(f'{key}.data_root: directory not found: {root!r}; '
                                   + DATA_ROOT_HINT)
        ann = dataset.get('ann_file')
        if ann and not osp.isfile(osp.join(root, ann)):
            raise MissingPathError(f'{key}.ann_file: file not found: {osp.join(root, ann)!r}; '
                                   + DATA_ROOT_HINT)
        for name, prefix in (dataset.get('data_prefix') or {}).items():
            if prefix and not osp.isdir(osp.join(root, prefix)):
                raise MissingPathError(
                    f'{key}.data_prefix.{name}: directory not found: '
                    f'{osp.join(root, prefix)!r}; ' + DATA_ROOT_HINT)
    for name, loader in EVALUATORS.items():
        if loader not in loaders:
            continue
        for evaluator in _evaluator_cfgs(cfg, name):
            ann = evaluator.get('ann_file')
            if isinstance(ann, str) and ann and not osp.isfile(ann):
                raise MissingPathError(f'{name}.ann_file: file not found: {ann!r}; '
                                       + DATA_ROOT_HINT)


def check_pretrained_paths(cfg: Config) -> None:
    """Raise MissingPathError naming the ``init_cfg`` key whose local checkpoint is missing."""
    for path, node in _walk(cfg.model, 'model'):
        if node.get('type') != 'Pretrained' or not isinstance(node.get('checkpoint'), str):
            continue
        ckpt = node['checkpoint']
        if '://' in ckpt or ckpt.startswith(('torchvision', 'open-mmlab', 'mmcls', 'mmpretrain')):
            continue  # a URL or model-zoo name: mmengine fetches it
        if not osp.isfile(ckpt):
            raise MissingPathError(
                f'{path}.checkpoint: checkpoint not found: {ckpt!r}; convert or download one '
                '(README, "Weights"), or set it with --cfg-options '
                f'{path}.checkpoint=PATH, or {path}=None to start from random weights')


def did_you_mean(word: str, choices) -> str:
    """' (did you mean 'x'?)' for the closest of ``choices``, or ''."""
    close = closest(word, choices)
    return f' (did you mean {close!r}?)' if close else ''


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
        valid = [k for k in params if k != 'self']
        raise ConfigArgumentError(
            f'model.backbone: {cls.__name__} takes no argument {unknown[0]!r}'
            + did_you_mean(unknown[0], valid)
            + (f' (also unknown: {unknown[1:]})' if unknown[1:] else '')
            + f'; it takes {valid}')
