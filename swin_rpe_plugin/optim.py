"""Mixed-precision training on any device: an optim wrapper that runs the forward in autocast.

mmengine's ``AmpOptimWrapper`` asserts a GPU (it owns a CUDA ``GradScaler``), although
``torch.autocast`` runs bf16 on CPU. bf16 has float32's exponent range, so gradients need no
loss scale: this wrapper only opens the autocast region around the forward and loss, as
``AmpOptimWrapper.optim_context`` does. Parameters, gradients, optimizer state and checkpoints
stay float32. fp16 needs a loss scale: on CUDA use mmengine's ``AmpOptimWrapper`` (what
``tools/train.py --amp`` picks there).

Config: ``optim_wrapper = dict(type='swin_rpe_plugin.AutocastOptimWrapper', dtype='bfloat16',
optimizer=...)``. ``autocast_modules=['backbone', 'neck']`` limits autocast to those submodules
(outputs cast back to float32): mmcv's CPU ops (nms, RoIAlign) have no bf16 kernels, so a
two-stage detector's heads must stay float32 on CPU.
"""
from contextlib import ExitStack, contextmanager
from typing import Optional, Sequence, Union

import torch
import torch.nn as nn
from mmengine.optim import OptimWrapper

from .registry import OPTIM_WRAPPERS

__all__ = ['AutocastOptimWrapper']


@OPTIM_WRAPPERS.register_module()
class AutocastOptimWrapper(OptimWrapper):
    """``OptimWrapper`` whose ``optim_context`` runs under ``torch.autocast(dtype)``.

    Args:
        dtype: 'bfloat16' (default) or torch.bfloat16. fp16 is refused: it needs loss scaling,
            which mmengine's AmpOptimWrapper provides on CUDA.
        device_type: autocast's device type; by default that of the model's parameters.
        autocast_modules: names of submodules (e.g. ['backbone', 'neck']) to run under
            autocast, their outputs cast back to float32; None runs the whole forward in it.
        **kwargs: those of ``OptimWrapper`` (optimizer, clip_grad, accumulative_counts).
    """

    def __init__(self, dtype: Union[str, torch.dtype] = 'bfloat16',
                 device_type: Optional[str] = None,
                 autocast_modules: Optional[Sequence[str]] = None, **kwargs):
        if dtype not in ('bfloat16', torch.bfloat16):
            raise ValueError(f'AutocastOptimWrapper dtype={dtype!r}: only bfloat16 trains '
                             'without a loss scale; for float16 use AmpOptimWrapper on CUDA')
        super().__init__(**kwargs)
        self.cast_dtype = torch.bfloat16
        self.device_type = device_type
        self.autocast_modules = None if autocast_modules is None else list(autocast_modules)

    @contextmanager
    def optim_context(self, model: nn.Module):
        device = self.device_type or next(model.parameters()).device.type
        with super().optim_context(model), ExitStack() as stack:
            if self.autocast_modules is None:
                stack.enter_context(torch.autocast(device, dtype=self.cast_dtype))
            else:
                inner = getattr(model, 'module', model)  # unwrap DDP
                for name in self.autocast_modules:
                    if not hasattr(inner, name):
                        children = sorted(dict(inner.named_children()))
                        raise ValueError(f'autocast_modules: the model has no submodule '
                                         f'{name!r}; choose among {children}')
                    region = _AutocastRegion(device, self.cast_dtype)
                    for handle in region.attach(getattr(inner, name)):
                        stack.callback(handle.remove)
            yield


class _AutocastRegion:
    """Forward hooks that run one submodule under autocast and cast its outputs to float32."""

    def __init__(self, device: str, dtype: torch.dtype):
        self.device, self.dtype, self.open = device, dtype, []

    def attach(self, module: nn.Module):
        return (module.register_forward_pre_hook(self._enter),
                module.register_forward_hook(self._exit))

    def _enter(self, module, args):
        region = torch.autocast(self.device, dtype=self.dtype)
        region.__enter__()
        self.open.append(region)

    def _exit(self, module, args, output):
        self.open.pop().__exit__(None, None, None)
        return _to_float32(output)


def _to_float32(value):
    if isinstance(value, torch.Tensor):
        return value.float() if value.is_floating_point() else value
    if isinstance(value, (list, tuple)):
        return type(value)(_to_float32(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_float32(v) for k, v in value.items()}
    return value
