"""Sharding the Swin backbone with torch's FSDP: one unit per block.

A Swin block is what a transformer layer is to FSDP: its parameters are gathered for its forward
and backward and freed after, so a rank holds one block's weights unsharded at a time. The
units (:func:`sharding_units`) are every Swin block, every patch merging, the patch embedding
and the backbone's output norms: the block's numerics read all of its parameters at once (never
wrap a module inside a block: its forward is not called on the fast routes), and
``frozen_stages`` freezes exactly a union of units, so no flat parameter mixes frozen and
trainable tensors (what FSDP1 requires with ``use_orig_params=False``).

- FSDP1: ``FullyShardedDataParallel(model, auto_wrap_policy=swin_wrap_policy(model), ...)``.
- FSDP2: :func:`fully_shard_per_block` applies ``fully_shard`` to each unit, then the root.
- mmengine's FlexibleRunner: :class:`FSDPStrategy` (mmengine's, resuming on torch >= 2.1) with
  ``model_wrapper=dict(auto_wrap_policy='swin_rpe_plugin.swin_block_wrap_policy')``, a
  function policy (mmengine passes no model) whose units are the blocks, patch mergings and
  patch embedding; the output norms stay with the root, which mixes frozen and trainable
  parameters when stages are frozen: FSDP takes that with ``use_orig_params=True`` (mmengine's
  default).
"""
from typing import List

import torch
import torch.nn as nn

from ..models.layers import PatchEmbed, PatchMerging, SwinBlock
from ..models.swin import SwinTransformer
from mmengine._strategy import FSDPStrategy as MMEngineFSDPStrategy

from .. import compat
from ..registry import FUNCTIONS, STRATEGIES

# Modules sharded as one unit each; nothing inside one is a unit of its own.
BLOCK_UNITS = (SwinBlock, PatchMerging, PatchEmbed)


def sharding_units(model: nn.Module) -> List[nn.Module]:
    """Every Swin block, patch merging, patch embedding and Swin backbone output norm in
    ``model`` (a backbone or a whole detector / segmentor), in module order."""
    units = []
    for module in model.modules():
        if isinstance(module, BLOCK_UNITS):
            units.append(module)
        elif isinstance(module, SwinTransformer):
            units += [getattr(module, f'norm{i}') for i in module.out_indices]
    return units


def swin_wrap_policy(model: nn.Module):
    """FSDP1's ``auto_wrap_policy`` for ``model``: one unit per :func:`sharding_units` entry
    (torch's ``CustomPolicy``, bound to this model's modules)."""
    from torch.distributed.fsdp.wrap import CustomPolicy
    units = set(sharding_units(model))
    return CustomPolicy(lambda module: module in units)


@FUNCTIONS.register_module()
def swin_block_wrap_policy(module: nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
    """FSDP1's function-style policy for configs (mmengine's ``auto_wrap_policy`` by name):
    each Swin block, patch merging and patch embedding a unit; see the module docstring."""
    return recurse or isinstance(module, BLOCK_UNITS)


def fully_shard_per_block(model: nn.Module, **kwargs) -> nn.Module:
    """FSDP2: ``fully_shard(unit, **kwargs)`` for each of :func:`sharding_units`, then the root
    (the rest of the model). Returns the model, sharded in place."""
    fully_shard = compat.fully_shard()
    for unit in sharding_units(model):
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    return model


@STRATEGIES.register_module()
class FSDPStrategy(MMEngineFSDPStrategy):
    """mmengine's ``FSDPStrategy`` that also runs where its own stops:

    - resume: mmengine 0.10 passes the optimizer state to torch's
      ``FSDP.optim_state_dict_to_load`` in torch 2.0's argument order, which torch >= 2.1 reads
      as the model ("TypeError: unhashable type: 'dict'"); here by keyword;
    - CPU: without CUDA the wrapper's ``device_id`` is the CPU (mmengine passes LOCAL_RANK, a
      CUDA device), as ``engine/config.adapt_to_device`` sets for mmengine's own strategy.
    """

    def _wrap_model(self, model: nn.Module):
        if not torch.cuda.is_available():
            self.model_wrapper = dict(self.model_wrapper or
                                      dict(type='MMFullyShardedDataParallel'))
            self.model_wrapper['device_id'] = 'cpu'
        return super()._wrap_model(model)

    def load_optim_state_dict(self, state_dict: dict) -> None:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        self.optim_wrapper.load_state_dict(FSDP.optim_state_dict_to_load(
            model=self.model, optim=self.optim_wrapper.optimizer, optim_state_dict=state_dict))


__all__: List[str] = ['BLOCK_UNITS', 'FSDPStrategy', 'fully_shard_per_block', 'sharding_units',
                      'swin_block_wrap_policy', 'swin_wrap_policy']
