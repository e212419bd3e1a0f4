"""Library code behind tools/train.py, tools/test.py and tools/demo.py (needs mmengine, and
mmdet or mmseg for the config at hand; not imported by ``import swin_rpe_plugin``)."""
from .config import (CheckpointMismatchError, ConfigArgumentError, ConfigError,
                     MissingPathError, UsageError, load_config, toolkit_of)
from .run import test, train

__all__ = ['CheckpointMismatchError', 'ConfigArgumentError', 'ConfigError', 'MissingPathError',
           'UsageError', 'load_config', 'test', 'toolkit_of', 'train']
