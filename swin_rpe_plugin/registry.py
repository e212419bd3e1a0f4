"""The package's registry: a child of mmengine's MODELS with scope 'swin_rpe_plugin'.

This is the only glue to the OpenMMLab registries. mmdet's and mmseg's MODELS are siblings
under the same root, so both build ``dict(type='swin_rpe_plugin.SwinTransformer')`` once this
package is imported (``custom_imports=dict(imports=['swin_rpe_plugin'])``).
"""
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import Registry

MODELS = Registry('model', parent=MMENGINE_MODELS, scope='swin_rpe_plugin',
                  locations=['swin_rpe_plugin.models'])
