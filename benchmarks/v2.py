"""SwinV2 benchmark: our SwinTransformerV2 against transformers' Swinv2Model, same weights.

transformers is not a dependency: it is imported only here, from wherever PYTHONPATH puts it
(``PYTHONPATH=/path/to/transformers-dir``); :func:`transformers_available` says whether it can.
The reference runs ``Swinv2Model(pixel_values, output_hidden_states=True)``; ours returns its
four normed stage maps. Parity compares each of our stages with transformers' stage output
before patch merging (hooked), passed through our output norm.
"""
import math
import os
import tempfile
from typing import Tuple

import torch

from .backbone import backbone_gflops, max_abs_diff, max_rel_err, step_fn
from .runner import ChildStep, Comparison

ARCHS_V2 = {
    'v2-tiny': dict(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)),
    'v2-small': dict(embed_dims=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24)),
    'v2-base': dict(embed_dims=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32)),
}


def transformers_available() -> bool:
    try:
        from transformers import Swinv2Model  # noqa: F401
    except Exception:  # not installed, or installed for another torch/numpy
        return False
    return True


def build_v2_pair(arch: str, shape: Tuple[int, int], window: int = 8, seed: int = 0):
    """(transformers Swinv2Model, ours) with the same random weights, loaded through our loader.

    Weights are drawn so that every part matters (norm gains 1 + 0.2 N, biases 0.1 N, linear
    N(0, 1)/sqrt(fan_in)); ``image_size`` is the benchmark shape, so transformers keeps the
    window wherever the map is larger than it.
    """
    from safetensors.torch import save_file
    from transformers import Swinv2Config, Swinv2Model

    from swin_rpe_plugin.checkpoint import load_pretrained
    from swin_rpe_plugin.models import SwinTransformerV2
    cfg = ARCHS_V2[arch]
    config = Swinv2Config(image_size=list(shape), patch_size=4, embed_dim=cfg['embed_dims'],
                          depths=list(cfg['depths']), num_heads=list(cfg['num_heads']),
                          window_size=window, mlp_ratio=4.0, qkv_bias=True,
                          drop_path_rate=0.0, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0, layer_norm_eps=1e-5)
    torch.manual_seed(seed)
    reference = Swinv2Model(config, add_pooling_layer=False)
    with torch.no_grad():
        for name, p in reference.named_parameters():
            if name.endswith('logit_scale'):
                p.copy_(math.log(10.0) + 0.5 * torch.randn(p.shape))
            elif p.ndim >= 2:
                p.copy_(torch.randn(p.shape) / math.sqrt(p[0].numel()))
            elif name.endswith('weight'):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape))
            else:
                p.copy_(0.1 * torch.randn(p.shape))
    ours = SwinTransformerV2(**cfg, window_size=window, drop_path_rate=0.0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, 'swinv2.safetensors')
        save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, path)
        report = load_pretrained(ours, path)
    assert not report.missing and not report.unexpected, report.summary()
    return reference, ours


def reference_step(model, mode: str, dtype: str = 'fp32'):
    """transformers' forward with every stage's hidden state, as a step function."""
    def forward(x):
        out = model(pixel_values=x, output_hidden_states=True)
        return list(out.reshaped_hidden_states) + [out.last_hidden_state]

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return forward(x)
    return step_fn(Wrapped(), mode, dtype)


def v2_parity(reference, ours, x: torch.Tensor) -> float:
    """Max |ours - norm_i(reference stage i)| over the four stages (eval, no grad)."""
    import torch.nn.functional as F
    stages = []

    def grab(module, args, out):  # Swinv2Stage -> (merged, before merging, dims)
        b, _, c = out[1].shape
        stages.append(out[1].view(b, out[2][0], out[2][1], c).permute(0, 3, 1, 2))
    handles = [layer.register_forward_hook(grab) for layer in reference.encoder.layers]
    try:
        with torch.no_grad():
            reference.eval()(pixel_values=x)
            outs = ours.eval()(x)
    finally:
        for h in handles:
            h.remove()
    normed = []
    for i, t in enumerate(stages):
        norm = getattr(ours, f'norm{i}')
        normed.append(F.layer_norm(t.permute(0, 2, 3, 1), t.shape[1:2], norm.weight, norm.bias,
                                   norm.eps).permute(0, 3, 1, 2))
    return max_abs_diff(outs, normed)


def v2_memory_step(which: str, arch: str, shape, batch: int, mode: str, dtype: str,
                   window: int):
    """(step, input) of one side of the pair, built alone: what a memory child measures."""
    reference, ours = build_v2_pair(arch, tuple(shape), window)
    step = step_fn(ours, mode, dtype) if which == 'ours' else reference_step(reference, mode, dtype)
    return step, torch.randn(batch, 3, *shape)


def v2_comparison(arch: str, shape: Tuple[int, int], batch: int, mode: str,
                  dtype: str = 'fp32', window: int = 8) -> Comparison:
    """transformers' Swinv2Model against our SwinTransformerV2, same weights and input.

    max_abs_diff is the stage parity of :func:`v2_parity` (float32); rel_err_vs_fp32 compares
    ours in ``dtype`` with ours in float32. The roofline counts our forward (x3 for train).
    """
    reference, ours = build_v2_pair(arch, shape, window)
    x = torch.randn(batch, 3, *shape)
    checks = dict(max_abs_diff=v2_parity(reference, ours, x),
                  rel_err_vs_fp32=max_rel_err(step_fn(ours, 'infer', dtype)(x),
                                              step_fn(ours, 'infer')(x)))
    gflops = backbone_gflops(ours, shape, batch) * (3 if mode == 'train' else 1)
    key = dict(kind='v2', arch=arch, shape=list(shape), batch=batch, mode=mode, dtype=dtype,
               window=window)
    memory = {which: ChildStep(f'{__name__}:v2_memory_step',
                               dict(which=which, arch=arch, shape=list(shape), batch=batch,
                                    mode=mode, dtype=dtype, window=window))
              for which in ('transformers', 'ours')}
    steps = {'transformers': reference_step(reference, mode, dtype),
             'ours': step_fn(ours, mode, dtype)}
    return Comparison(key, steps, x, baseline='transformers', gflops=gflops, roof_dtype=dtype,
                      checks=checks, memory=memory)
