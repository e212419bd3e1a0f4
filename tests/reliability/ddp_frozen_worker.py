"""One rank of the frozen-stages DDP check (tests/reliability/test_distributed_frozen.py), run
by torchrun: every case wraps a tiny backbone in ``DistributedDataParallel`` before calling
``train()`` (mmengine's Runner order, no ``find_unused_parameters``), trains a few SGD steps
with drop path on, and writes what it saw to ``OUT/rank{r}.pt``.

    python -m torch.distributed.run --nproc_per_node 2 ddp_frozen_worker.py OUT
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

SMALL = dict(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4), window_size=4,
             drop_path_rate=0.3)
STEPS = 3
CASES = [(arch, frozen) for arch in ('v1', 'v2') for frozen in (-1, 0, 1, 3)] + [('mmdet', 1)]


def build(arch: str, frozen: int) -> torch.nn.Module:
    if arch == 'mmdet':
        from mmdet.models.backbones import SwinTransformer as Stock
        return Stock(**SMALL, frozen_stages=frozen)
    from swin_rpe_plugin import SwinTransformer, SwinTransformerV2
    cls = SwinTransformer if arch == 'v1' else SwinTransformerV2
    return cls(**SMALL, frozen_stages=frozen)


def run_case(arch: str, frozen: int, rank: int) -> dict:
    torch.manual_seed(0)  # the same initial weights on both ranks (DDP broadcasts them too)
    model = build(arch, frozen)
    model.init_weights()
    with torch.no_grad():  # SwinV2's post-norms start at zero (every block an identity): as
        for name, p in model.named_parameters():  # fine-tuning meets them, at one
            if '.blocks.' in name and name.endswith(('norm1.weight', 'norm2.weight')):
                p.fill_(1.0)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    ddp = DistributedDataParallel(model)
    ddp.train()
    optimizer = torch.optim.SGD([p for p in ddp.parameters() if p.requires_grad], lr=0.1)
    torch.manual_seed(100 + rank)  # each rank its own images and drop path draws
    error = None
    try:
        for _ in range(STEPS):
            x = torch.randn(2, 3, 40, 56)
            loss = sum(o.square().mean() for o in ddp(x))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    except RuntimeError as err:
        error = str(err).splitlines()[0]
    after = {k: v.detach().clone() for k, v in model.named_parameters()}
    frozen_names = sorted(k for k, v in model.named_parameters() if not v.requires_grad)
    eval_names = sorted(n for n, m in model.named_modules() if not m.training)
    return dict(error=error, before=before, after=after, frozen=frozen_names,
                eval=eval_names)


def main(out: str) -> None:
    dist.init_process_group('gloo')
    rank = dist.get_rank()
    results = {}
    for arch, frozen in CASES:
        results[f'{arch}:{frozen}'] = run_case(arch, frozen, rank)
        dist.barrier()
    torch.save(results, os.path.join(out, f'rank{rank}.pt'))
    dist.destroy_process_group()


if __name__ == '__main__':
    main(sys.argv[1])
