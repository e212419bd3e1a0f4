"""One rank of the sharded-training check (tests/reliability/test_distributed_sharded.py), run
by torchrun with 2 gloo processes: each case shards a tiny backbone per block with torch's
FSDP1 (``use_orig_params`` True and False) or FSDP2 (``fully_shard``), trains SGD steps on
this rank's images with an inference forward after each, and writes the full weights and the
outputs to ``OUT/rank{r}.pt``. Rank 0 also computes the references in one process: the
unsharded model trained on both ranks' images (FSDP averages the ranks' gradients; float32
cases), and after each step an unsharded copy holding the sharded model's weights run on the
same images (what the inference forward must give, whatever was kept from earlier forwards).

    python -m torch.distributed.run --nproc_per_node 2 fsdp_worker.py OUT
"""
import os
import sys

import torch
import torch.distributed as dist

from swin_rpe_plugin.compat import HAS_FULLY_SHARD

SMALL = dict(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4), window_size=4,
             out_indices=(0, 1, 2, 3), drop_path_rate=0.)  # one process draws as two cannot
STEPS = 3
LR = 0.002
# (name, wrapper, arch, frozen_stages, with_cp, backend, autocast dtype); bf16: the casts of
# the weights kept between inference forwards must follow the weights FSDP gathers anew
CASES = [
    ('fsdp1-orig:v1', 'fsdp1-orig', 'v1', 1, False, 'auto'),
    ('fsdp1-orig:v1:bf16', 'fsdp1-orig', 'v1', 1, False, 'auto', torch.bfloat16),
    ('fsdp1-flat:v1:generic:bf16', 'fsdp1-flat', 'v1', 1, False, 'generic', torch.bfloat16),
    ('fsdp2:v1:bf16', 'fsdp2', 'v1', 1, False, 'auto', torch.bfloat16),
    ('fsdp1-orig-cp:v1', 'fsdp1-orig', 'v1', 1, True, 'auto'),
    ('fsdp1-flat:v1', 'fsdp1-flat', 'v1', 1, False, 'auto'),
    ('fsdp1-flat-cp:v1', 'fsdp1-flat', 'v1', 2, True, 'auto'),
    ('fsdp1-flat:v1:generic', 'fsdp1-flat', 'v1', 1, False, 'generic'),
    ('fsdp1-orig-cp:v1:generic', 'fsdp1-orig', 'v1', 0, True, 'generic'),
    ('fsdp1-flat:v2', 'fsdp1-flat', 'v2', 1, False, 'auto'),
    ('fsdp1-orig-cp:v2', 'fsdp1-orig', 'v2', 1, True, 'auto'),
    ('fsdp2:v1', 'fsdp2', 'v1', 1, False, 'auto'),
    ('fsdp2-cp:v1:generic', 'fsdp2', 'v1', 1, True, 'generic'),
    ('fsdp2:v2', 'fsdp2', 'v2', 2, False, 'auto'),
]
if not HAS_FULLY_SHARD:  # FSDP2 came with torch 2.4
    CASES = [case for case in CASES if case[1] != 'fsdp2']


def build(arch: str, frozen: int, with_cp: bool) -> torch.nn.Module:
    from swin_rpe_plugin import SwinTransformer, SwinTransformerV2
    cls = SwinTransformer if arch == 'v1' else SwinTransformerV2
    torch.manual_seed(0)  # the same initial weights on every rank and in the reference
    model = cls(**SMALL, frozen_stages=frozen, with_cp=with_cp)
    model.init_weights()
    with torch.no_grad():  # SwinV2's post-norms start at zero (every block an identity): as
        for name, p in model.named_parameters():  # fine-tuning meets them, at one
            if '.blocks.' in name and name.endswith(('norm1.weight', 'norm2.weight')):
                p.fill_(1.0)
    return model


def images(rank: int, step: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(2, 3, 40, 56, generator=generator)


def loss_of(outputs) -> torch.Tensor:
    # Not a function of the output norms alone (their outputs' mean square is ~1 whatever
    # the weights before them): every weight gets a gradient well above rounding.
    return sum((o.sin() + o[:, :1]).mean() for o in outputs)


def infer(model, x) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return torch.cat([o.flatten(1) for o in model(x)], 1)


def train(model, step_images, full_weights) -> dict:
    """STEPS SGD steps on ``step_images(step)``; an inference forward of the same images after
    each (eval mode, no gradient) and the full weights it ran with."""
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR)
    losses, inferred, weights = [], [], []
    for step in range(STEPS):
        model.train()
        loss = step_images(step, lambda x: loss_of(model(x)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
        inferred.append(step_images(step, lambda x: infer(model, x)))
        weights.append(full_weights(model))
    return dict(losses=losses, inferred=inferred, weights=weights[-1], step_weights=weights)


def shard(model, wrapper: str):
    from swin_rpe_plugin.engine.sharding import fully_shard_per_block, swin_wrap_policy
    if wrapper == 'fsdp2':
        return fully_shard_per_block(model)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    return FSDP(model, auto_wrap_policy=swin_wrap_policy(model), device_id=torch.device('cpu'),
                use_orig_params=wrapper == 'fsdp1-orig')


def full_weights_fsdp1(model) -> dict:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    with FSDP.summon_full_params(model):
        return {k: v.detach().clone() for k, v in model.named_parameters()}


def full_weights_fsdp2(model) -> dict:
    return {k: v.full_tensor().detach().clone() for k, v in model.named_parameters()}


def run_case(wrapper, arch, frozen, with_cp, backend, dtype=None, *, rank, world) -> dict:
    from swin_rpe_plugin.ops.dispatch import force_backend
    with force_backend(backend), torch.autocast('cpu', dtype, enabled=dtype is not None):
        model = build(arch, frozen, with_cp)
        before = {k: v.detach().clone() for k, v in model.named_parameters()}
        frozen_names = sorted(k for k, v in model.named_parameters() if not v.requires_grad)
        sharded = shard(model, wrapper)
        error = None
        try:
            result = train(sharded, lambda step, f: f(images(rank, step)),
                           full_weights_fsdp2 if wrapper == 'fsdp2' else full_weights_fsdp1)
        except Exception as err:  # reported, so the test names the case that failed
            error, result = f'{type(err).__name__}: {str(err).splitlines()[0]}', {}
        reference, unsharded = None, []
        if rank == 0 and error is None:
            for step, weights in enumerate(result.pop('step_weights')):
                copy = build(arch, frozen, with_cp)
                copy.load_state_dict(weights, strict=False)  # the index buffers are derived
                unsharded.append(infer(copy, images(0, step)))
        if rank == 0 and dtype is None:
            # bf16 trajectories part after a step or two whoever computes them (mmdet's Swin
            # in bf16 parts from its float32 one as much): the float32 ones agree bit for bit
            def both_ranks(step, f):  # the mean over ranks, as FSDP averages gradients
                return sum(f(images(r, step)) for r in range(world)) / world \
                    if torch.is_grad_enabled() else f(images(0, step))
            reference = train(build(arch, frozen, with_cp), both_ranks,
                              lambda m: {k: v.detach().clone()
                                         for k, v in m.named_parameters()})
            reference.pop('step_weights')
    result.pop('step_weights', None)
    return dict(error=error, before=before, frozen=frozen_names, reference=reference,
                unsharded=unsharded, **result)


def main(out: str) -> None:
    dist.init_process_group('gloo')
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for name, *case in CASES:
        results[name] = run_case(*case, rank=rank, world=world)
        dist.barrier()
    torch.save(results, os.path.join(out, f'rank{rank}.pt'))
    dist.destroy_process_group()


if __name__ == '__main__':
    main(sys.argv[1])
