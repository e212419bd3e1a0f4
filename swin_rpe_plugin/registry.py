"""The package's registries: children of mmengine's with scope 'swin_rpe_plugin'.

This is the only glue to the OpenMMLab registries. mmdet's and mmseg's registries are siblings
under the same roots, so both build ``dict(type='swin_rpe_plugin.SwinTransformer')`` (and
``custom_hooks=[dict(type='swin_rpe_plugin.PaddingAwareHook')]``,
``dict(type='swin_rpe_plugin.RNGStateHook')``,
``optim_wrapper=dict(type='swin_rpe_plugin.AutocastOptimWrapper')``, FSDP's
``auto_wrap_policy='swin_rpe_plugin.swin_block_wrap_policy'``,
``strategy=dict(type='swin_rpe_plugin.FSDPStrategy')``) once this package is imported (``custom_imports=dict(imports=['swin_rpe_plugin'])``).
"""
from mmengine.registry import FUNCTIONS as MMENGINE_FUNCTIONS
from mmengine.registry import HOOKS as MMENGINE_HOOKS
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import OPTIM_WRAPPERS as MMENGINE_OPTIM_WRAPPERS
from mmengine.registry import STRATEGIES as MMENGINE_STRATEGIES
from mmengine.registry import Registry

MODELS = Registry('model', parent=MMENGINE_MODELS, scope='swin_rpe_plugin',
                  locations=['swin_rpe_plugin.models'])
# RNGStateHook lives in engine/ (a training concern) and is imported when a config builds it.
HOOKS = Registry('hook', parent=MMENGINE_HOOKS, scope='swin_rpe_plugin',
                 locations=['swin_rpe_plugin.models', 'swin_rpe_plugin.engine.rng_state'])
OPTIM_WRAPPERS = Registry('optim_wrapper', parent=MMENGINE_OPTIM_WRAPPERS,
                          scope='swin_rpe_plugin', locations=['swin_rpe_plugin.optim'])
# FSDP wrap policies (engine/sharding.py), imported when a config names one.
FUNCTIONS = Registry('function', parent=MMENGINE_FUNCTIONS, scope='swin_rpe_plugin',
                     locations=['swin_rpe_plugin.engine.sharding'])
STRATEGIES = Registry('strategy', parent=MMENGINE_STRATEGIES, scope='swin_rpe_plugin',
                      locations=['swin_rpe_plugin.engine.sharding'])
