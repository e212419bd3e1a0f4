"""Backbone comparison: our Swin against mmdet 3.3's SwinTransformer, same config and weights.

:func:`backbone_comparison` describes one record (eager, or both backbones under
``torch.compile``) for the loop of ``runner``; the step functions and output diffs here
serve every comparison (SwinV2, runtimes, whole models).
"""
import contextlib
from typing import Optional, Sequence, Tuple

import torch

from swin_rpe_plugin.ops.dispatch import backend

from .runner import DTYPES, ChildStep, Comparison

__all__ = ['ARCHS', 'DTYPES', 'build_model', 'build_pair', 'step_fn', 'max_abs_diff',
           'max_rel_err', 'backbone_gflops', 'backbone_comparison', 'memory_step',
           'WORK_SIDES', 'backbone_work']

ARCHS = {
    'tiny': dict(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)),
    'small': dict(embed_dims=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24)),
    'base': dict(embed_dims=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32)),
    'large': dict(embed_dims=192, depths=(2, 2, 18, 2), num_heads=(6, 12, 24, 48)),
}


def build_model(which: str, arch: str, window_size: int = 7, seed: int = 0,
                with_cp: bool = False, **ours_kwargs):
    """mmdet's Swin ('mmdet') or ours ('ours') with the same seeded random weights;
    ``with_cp``: both checkpoint their blocks (mmdet's argument)."""
    from mmdet.models.backbones import SwinTransformer as MMDetSwin

    from swin_rpe_plugin.models import SwinTransformer
    cfg = dict(ARCHS[arch], window_size=window_size, drop_path_rate=0.0, with_cp=with_cp)
    torch.manual_seed(seed)
    model = MMDetSwin(**cfg) if which == 'mmdet' else SwinTransformer(**cfg, **ours_kwargs)
    model.init_weights()
    torch.manual_seed(seed + 1)
    with torch.no_grad():  # mmdet leaves bias tables at zero; give them values
        for name, p in model.named_parameters():
            if 'relative_position_bias_table' in name:
                p.normal_(0, 0.5)
    return model


def build_pair(arch: str, window_size: int = 7, seed: int = 0, with_cp: bool = False,
               **ours_kwargs):
    """mmdet's Swin with random weights (tables included) and ours loaded from its state dict."""
    stock = build_model('mmdet', arch, window_size, seed, with_cp)
    ours = build_model('ours', arch, window_size, seed, with_cp, **ours_kwargs)
    ours.load_state_dict(stock.state_dict(), strict=True)
    return stock, ours


def step_fn(model: torch.nn.Module, mode: str, dtype: str = 'fp32'):
    """A callable running one inference or one train step (forward + backward) on x.

    dtype 'bf16'/'fp16' runs the forward under ``torch.autocast`` of that dtype (weights stay
    float32, as in mixed-precision training); 'fp32' runs without autocast.
    """
    def autocast(x):
        # fp32: no autocast region (torch 2.1's CPU autocast refuses float32; meta has none)
        if dtype == 'fp32':
            return contextlib.nullcontext()
        return torch.autocast(x.device.type, dtype=DTYPES[dtype])

    if mode == 'infer':
        model.eval()

        def run(x):
            with torch.no_grad(), autocast(x):
                return model(x)
    else:
        model.train()

        def run(x):
            with autocast(x):
                outs = model(x)
            sum(o.float().mean() for o in outs).backward()
            for p in model.parameters():
                p.grad = None
            return outs
    return run


def max_abs_diff(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))


def max_rel_err(a: Sequence[torch.Tensor], ref: Sequence[torch.Tensor]) -> float:
    """Largest, over the outputs, of max |a - ref| / max |ref|."""
    return max(((x.float() - y.float()).abs().max() / y.float().abs().max()).item()
               for x, y in zip(a, ref))


def backbone_gflops(model: torch.nn.Module, shape: Tuple[int, int], batch: int) -> float:
    """Forward GFLOPs (2 x multiply-adds counted by mmengine's FlopAnalyzer on the model)."""
    from mmengine.analysis import FlopAnalyzer
    model.eval()
    x = torch.randn(batch, 3, *shape)
    with torch.no_grad():
        analyzer = FlopAnalyzer(model, (x, ))
        analyzer.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
        return 2 * analyzer.total() / 1e9


def memory_step(which: str, arch: str, shape, batch: int, mode: str, dtype: str,
                ours_kwargs: dict, with_cp: bool = False):
    """(step, input) of one backbone, built alone: what a memory child process measures."""
    model = build_model(which, arch, with_cp=with_cp, **ours_kwargs)
    return step_fn(model, mode, dtype), torch.randn(batch, 3, *shape)


def _compiled(model: torch.nn.Module, mode: str) -> torch.nn.Module:
    if mode == 'infer':  # constant weights: inductor prepacks them for oneDNN
        import torch._inductor.config as inductor_config
        inductor_config.freezing = True
    return torch.compile(model)


def backbone_comparison(arch: str, shape: Tuple[int, int], batch: int, mode: str,
                        dtype: str = 'fp32', compile_model: bool = False,
                        ours_kwargs: Optional[dict] = None, with_cp: bool = False) -> Comparison:
    """mmdet's backbone against ours, same weights and input, one mode and dtype.

    max_abs_diff compares ours with mmdet under the same autocast; rel_err_vs_fp32 compares
    ours in ``dtype`` with ours in float32 (max |diff| / max |fp32 output|, worst output).
    With ``compile_model`` both run under ``torch.compile`` (baseline 'mmdet_compiled',
    candidate 'ours_compiled') next to our eager step ('ours'): compiled must beat compiled
    mmdet and never lose to our eager code. Memory is measured for eager records only.
    ``with_cp``: both backbones checkpoint their blocks (the record says ``with_cp``).
    """
    ours_kwargs = ours_kwargs or {}
    stock, ours = build_pair(arch, with_cp=with_cp, **ours_kwargs)
    x = torch.randn(batch, 3, *shape)
    reference = step_fn(ours, 'infer')(x)
    outs = step_fn(ours, 'infer', dtype)(x)
    checks = dict(max_abs_diff=max_abs_diff(step_fn(stock, 'infer', dtype)(x), outs),
                  rel_err_vs_fp32=max_rel_err(outs, reference))
    gflops = backbone_gflops(stock, shape, batch) * (3 if mode == 'train' else 1)
    key = dict(kind='backbone', arch=arch, shape=list(shape), batch=batch,
               mode=mode + ('+compile' if compile_model else ''), dtype=dtype, **ours_kwargs)
    if backend() == 'generic':  # what other devices run, timed on this CPU
        key['backend'] = 'generic'
    if with_cp:
        key['with_cp'] = True
    if compile_model:
        eager = build_model('ours', arch, with_cp=with_cp, **ours_kwargs)
        eager.load_state_dict(ours.state_dict())
        steps = {'mmdet_compiled': step_fn(_compiled(stock, mode), mode, dtype),
                 'ours_compiled': step_fn(_compiled(ours, mode), mode, dtype),
                 'ours': step_fn(eager, mode, dtype)}
        compiled_outs = steps['ours_compiled'](x) if mode == 'infer' else None
        if compiled_outs is not None:
            checks['compiled_vs_eager_max_abs_diff'] = max_abs_diff(compiled_outs, outs)
        return Comparison(key, steps, x, baseline='mmdet_compiled', candidate='ours_compiled',
                          gflops=gflops, roof_dtype=dtype, checks=checks)
    memory = {which: ChildStep(f'{__name__}:memory_step',
                               dict(which=which, arch=arch, shape=list(shape), batch=batch,
                                    mode=mode, dtype=dtype, ours_kwargs=ours_kwargs,
                                    with_cp=with_cp))
              for which in ('mmdet', 'ours')}
    steps = {'mmdet': step_fn(stock, mode, dtype), 'ours': step_fn(ours, mode, dtype)}
    return Comparison(key, steps, x, baseline='mmdet', gflops=gflops, roof_dtype=dtype,
                      checks=checks, memory=memory)


WORK_SIDES = ('mmdet', 'ours', 'ours_generic')


def backbone_work(arch: str, shape: Tuple[int, int], batch: int, mode: str,
                  dtype: str = 'fp32', profiles: bool = False,
                  freeze_tables: bool = False, with_cp: bool = False) -> dict:
    """The exact work record of one case (``benchmarks/work.py``): mmdet's backbone, ours on the
    CPU path and ours on the generic path (``SWIN_RPE_BACKEND=generic``, what other devices
    run), same weights and input. Counts, so no timing and no memory child process.

    ``profiles`` keeps each side's bytes per operator and kept bytes per producer;
    ``freeze_tables``: no gradient for the relative position tables, in both models (the CPU's
    SDPA then runs its fused kernels both ways, as a GPU's does with a bias gradient too);
    ``with_cp``: both checkpoint their blocks. SwinV2 archs (``v2-*``): transformers'
    Swinv2Model in mmdet's place (``benchmarks/v2.py``, window 8)."""
    from swin_rpe_plugin.ops.dispatch import force_backend
    from .work import count_work, side_summary
    if arch.startswith('v2-'):
        from .v2 import build_v2_pair, reference_step
        baseline, (stock, ours) = 'transformers', build_v2_pair(arch, tuple(shape))
        baseline_step = reference_step(stock, mode, dtype)
    else:
        baseline, (stock, ours) = 'mmdet', build_pair(arch, with_cp=with_cp)
        baseline_step = step_fn(stock, mode, dtype)
    for model in (stock, ours) if freeze_tables else ():
        for name, p in model.named_parameters():
            if 'relative_position_bias_table' in name:
                p.requires_grad_(False)
    x = torch.randn(batch, 3, *shape)
    sides = {}
    for side in (baseline,) + WORK_SIDES[1:]:
        model = stock if side == baseline else ours
        with force_backend('generic' if side == 'ours_generic' else 'auto'):
            work = count_work(baseline_step if side == baseline else step_fn(model, mode, dtype),
                              x, model, backward=mode == 'train', launches=not with_cp)
        sides[side] = work if profiles else side_summary(work)
    return dict(kind='work', arch=arch, shape=list(shape), batch=batch, mode=mode, dtype=dtype,
                sides=sides, **({'baseline': baseline} if baseline != 'mmdet' else {}),
                **({'tables': 'frozen'} if freeze_tables else {}),
                **({'with_cp': True} if with_cp else {}))
