"""Complexity of Swin attention: the closed-form counts, and mmengine's counter made SDPA-aware.

Convention (mmengine's, fvcore's and the Swin paper's): one multiply-add (MAC) counts as one
"FLOP". The closed forms are those of the Swin paper (Eq. 1-2) for one attention layer on an
h x w x C map: global MSA 4hwC^2 + 2(hw)^2 C, window MSA 4hwC^2 + 2 M^2 hw C. The 4hwC^2 term is
the qkv and output projections; the other is q @ k^T plus attn @ v. Softmax, scaling and the
bias addition are not counted, by the formula or by mmengine.

mmengine's FlopAnalyzer has no handle for ``aten::scaled_dot_product_attention`` (our default
attention path), so it would silently skip the attention matmuls. :func:`flop_analyzer`
registers :func:`sdpa_flop_jit`, which counts exactly the two matmuls the explicit path counts.
"""
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch
from mmengine.analysis import FlopAnalyzer, parameter_count
from mmengine.analysis.jit_handles import get_shape
from torch import nn

from ..ops import padded_size, to_window_tuple

__all__ = ['CONVENTION', 'msa_flops', 'wmsa_flops', 'attention_table', 'sdpa_flop_jit',
           'flop_analyzer', 'OP_GROUPS', 'group_ops', 'backbone_breakdown',
           'stage_attention_formula', 'count_complexity']

CONVENTION = '1 multiply-add (MAC) = 1 FLOP (mmengine/fvcore convention, as in the Swin paper)'

# How an mmengine operator name falls into the groups the tool reports.
OP_GROUPS = {
    'linear': ('linear', 'addmm', 'mm'),
    'attention': ('scaled_dot_product_attention', 'matmul', 'bmm', 'einsum'),
}


def msa_flops(h: int, w: int, c: int) -> int:
    """MACs of one global multi-head self-attention layer on an h x w x C map."""
    _check_positive(h=h, w=w, c=c)
    return 4 * h * w * c * c + 2 * (h * w) ** 2 * c


def wmsa_flops(h: int, w: int, c: int, window) -> int:
    """MACs of one window attention layer (window M or (Mh, Mw)) on an h x w x C map.

    The paper's formula, for any window (the reference table uses M=3 on 112x112): it ignores
    padding. The backbone attends on the map padded to whole windows; that count is
    :func:`stage_attention_formula`.
    """
    _check_positive(h=h, w=w, c=c)
    mh, mw = to_window_tuple(window, 'window')
    return 4 * h * w * c * c + 2 * mh * mw * h * w * c


def attention_table(h: int, w: int, c: int, windows: Iterable) -> Dict[str, Any]:
    """Global against window attention on one map, in MACs (ints, exact).

    Returns:
        {'msa_flops': int, 'wmsa_flops': {str(window): int}}; window keys are 'M' for a square
        window and 'MhxMw' otherwise.
    """
    out = {}
    for window in windows:
        mh, mw = to_window_tuple(window, 'window')
        out[str(mh) if mh == mw else f'{mh}x{mw}'] = wmsa_flops(h, w, c, (mh, mw))
    return {'msa_flops': msa_flops(h, w, c), 'wmsa_flops': out}


def sdpa_flop_jit(inputs: List[Any], outputs: List[Any]) -> int:
    """mmengine handle for ``aten::scaled_dot_product_attention``: q @ k^T plus attn @ v.

    q: [..., L, E], k: [..., S, E], v: [..., S, Ev] -> L*S*E + L*S*Ev MACs per batch element,
    what ``aten::matmul`` counts for the two products of the explicit path.
    """
    q, k, v = (get_shape(x) for x in inputs[:3])
    if q is None or k is None or v is None:
        raise ValueError('scaled_dot_product_attention: input shapes are unknown to the tracer')
    batch = 1
    for d in q[:-2]:
        batch *= d
    length, embed, source, v_embed = q[-2], q[-1], k[-2], v[-1]
    return batch * length * source * (embed + v_embed)


def flop_analyzer(model: nn.Module, inputs) -> FlopAnalyzer:
    """mmengine's FlopAnalyzer with the SDPA handle registered, warnings left to the caller."""
    analyzer = FlopAnalyzer(model, inputs)
    analyzer.set_op_handle('aten::scaled_dot_product_attention', sdpa_flop_jit)
    analyzer.unsupported_ops_warnings(False)
    analyzer.uncalled_modules_warnings(False)
    return analyzer


def group_ops(by_operator: Dict[str, int]) -> Dict[str, int]:
    """Fold mmengine's per-operator counts into linear / attention / rest (and total)."""
    groups = dict(linear=0, attention=0, rest=0)
    for op, n in by_operator.items():
        name = next((g for g, ops in OP_GROUPS.items() if op in ops), 'rest')
        groups[name] += int(n)
    groups['total'] = sum(groups.values())
    return groups


def stage_attention_formula(backbone: nn.Module, input_hw: Tuple[int, int]) -> List[int]:
    """Attention-matmul MACs of each stage by the closed form 2 Mh Mw Hp Wp C per block.

    Hp x Wp is the stage's token map padded to whole windows (the backbone attends on it).
    """
    h, w = input_hw
    patch = backbone.patch_embed.patch_size
    h, w = -(-h // patch[0]), -(-w // patch[1])
    out = []
    for i, stage in enumerate(backbone.stages):
        c = backbone.num_features[i]
        mh, mw = stage.window_size
        hp, wp = padded_size((h, w), (mh, mw))
        out.append(len(stage.blocks) * 2 * mh * mw * hp * wp * c)
        if stage.downsample is not None:
            s = stage.downsample.stride
            h, w = -(-h // s), -(-w // s)
    return out


def backbone_breakdown(analyzer: FlopAnalyzer, backbone: nn.Module, prefix: str = '',
                       input_hw: Optional[Tuple[int, int]] = None) -> Dict[str, Dict[str, int]]:
    """Per-stage linear / attention / rest MACs and parameters of a Swin backbone.

    Args:
        analyzer: a traced :func:`flop_analyzer` over the model that holds the backbone.
        backbone: the SwinTransformer (to read its stages and parameters).
        prefix: the backbone's module name in the traced model ('' or 'backbone.').
        input_hw: the image size, to add each stage's closed-form attention count.

    Returns:
        {'patch_embed': {...}, 'stages.0': {...}, ..., 'norms': {...}}, each with the keys of
        :func:`group_ops` and 'params'; stages also 'attention_formula' when input_hw is given.
    """
    per_module = analyzer.by_module_and_operator()
    params = parameter_count(backbone)
    formula = stage_attention_formula(backbone, input_hw) if input_hw else None
    rows = {'patch_embed': dict(group_ops(per_module.get(prefix + 'patch_embed', {})),
                                params=params['patch_embed'])}
    for i in range(len(backbone.stages)):
        name = f'stages.{i}'
        rows[name] = dict(group_ops(per_module.get(prefix + name, {})), params=params[name])
        if formula is not None:
            rows[name]['attention_formula'] = formula[i]
    norms = [n for n, _ in backbone.named_children() if n.startswith('norm')]
    ops: Dict[str, int] = {}
    for n in norms:
        for op, v in per_module.get(prefix + n, {}).items():
            ops[op] = ops.get(op, 0) + v
    rows['norms'] = dict(group_ops(ops), params=sum(params[n] for n in norms))
    return rows


def count_complexity(model: nn.Module, inputs, backbone: Optional[nn.Module] = None,
                     backbone_prefix: str = 'backbone.',
                     input_hw: Optional[Tuple[int, int]] = None) -> Dict[str, Any]:
    """Parameters and MACs of a model (mmengine's counters), with a backbone breakdown.

    Args:
        model: any module, in eval mode.
        inputs: a tensor or tuple of positional inputs of ``model.forward``.
        backbone: the Swin backbone inside ``model`` (or ``model`` itself), for the breakdown.
        backbone_prefix: its module name in ``model`` plus '.', '' when it is ``model``.
        input_hw: image size, passed to :func:`backbone_breakdown`.

    Returns:
        {'params', 'flops', 'by_operator', 'unsupported_ops', 'by_module', 'backbone'}.
    """
    with torch.no_grad():
        analyzer = flop_analyzer(model, inputs)
        total = analyzer.total()
    by_module = analyzer.by_module()
    params = parameter_count(model)
    children = {n: dict(flops=int(by_module.get(n, 0)), params=int(params.get(n, 0)))
                for n, _ in model.named_children()}
    result = dict(params=int(params['']), flops=int(total),
                  by_operator={k: int(v) for k, v in analyzer.by_operator().items()},
                  unsupported_ops=dict(analyzer.unsupported_ops()), by_module=children)
    if backbone is not None:
        result['backbone'] = backbone_breakdown(analyzer, backbone, backbone_prefix, input_hw)
    return result


def _check_positive(**values: int) -> None:
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f'{name} must be a positive int, got {v!r}')

