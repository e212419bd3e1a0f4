"""Export to ONNX with dynamic batch, height and width, and check the file against PyTorch.

The backbone exports shape-generically because the core computes window plans, padding and
masks from symbolic sizes under a tracer (``ops/plan.py``'s ``traceable_window_plan``, the
explicit attention path), so one file runs at any input size. This module only chooses what to
export and how to verify it:

- ``backbone``: the backbone's feature maps;
- ``neck``: backbone + neck (``extract_feat``: FPN levels for mmdet, the decode head's input
  for mmseg);
- ``model``: the whole model in tensor mode, the heads' raw outputs. mmseg segmentors: the
  decode head's logits (1/4 of the input size; resizing and argmax are post-processing).
  mmdet single-stage detectors: every level's class scores and box deltas (decoding and NMS
  are post-processing). Two-stage detectors (Mask R-CNN, Cascade): backbone, neck and the RPN
  head's raw outputs; their RoI heads take proposals selected by NMS, a data-dependent step that
  deployments run in the runtime's own NMS (mmdeploy) and is not exported here.

Heads with adaptive pooling to more than one cell (UperNet's pyramid pooling module: 1, 2, 3
and 6 cells) have no ONNX form at a dynamic height and width: ONNX has no adaptive pooling, and
both exporters need the input size to turn it into fixed kernels. Such models export with
``dynamic_hw=False`` (dynamic batch, the export size fixed); their backbone exports dynamically.
"""
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from ..compat import HAS_DYNAMO_EXPORTER

PARTS = ('backbone', 'neck', 'model')
EXPORTERS = ('dynamo', 'classic')
# The exporter this torch has: torch.onnx.export(dynamo=True) came in torch 2.5; older torches
# export through TorchScript tracing ('classic').
DEFAULT_EXPORTER = 'dynamo' if HAS_DYNAMO_EXPORTER else 'classic'


def _flatten(value) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flatten(v)]
    if isinstance(value, dict):
        return [t for k in sorted(value) for t in _flatten(value[k])]
    raise TypeError(f'cannot export an output of type {type(value).__name__}')


class ExportPart(nn.Module):
    """Image batch -> tuple of tensors: the part of ``model`` that ``part`` names."""

    def __init__(self, model: nn.Module, part: str):
        super().__init__()
        if part not in PARTS:
            raise ValueError(f'part must be one of {PARTS}, got {part!r}')
        if part != 'backbone' and not hasattr(model, 'extract_feat'):
            raise ValueError(f'--part {part} needs a detector or segmentor (a model with '
                             'extract_feat); this model is a bare backbone: use --part backbone')
        self.model, self.part = model, part

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        model = self.model
        if self.part == 'backbone':
            backbone = getattr(model, 'backbone', model)
            return tuple(_flatten(backbone(x)))
        feats = model.extract_feat(x)
        if self.part == 'neck':
            return tuple(_flatten(feats))
        if hasattr(model, 'decode_head'):  # mmseg EncoderDecoder
            return (model.decode_head.forward(feats), )
        if hasattr(model, 'bbox_head'):  # mmdet single-stage
            return tuple(_flatten(model.bbox_head.forward(feats)))
        if hasattr(model, 'rpn_head'):  # mmdet two-stage: up to the RPN's raw outputs
            return tuple(_flatten(feats)) + tuple(_flatten(model.rpn_head.forward(feats)))
        raise ValueError(f'--part model: no known head on {type(model).__name__}; export '
                         '--part neck instead')

    def children_used(self) -> List[str]:
        """The model's children this part runs (their weights must all be loaded)."""
        if not hasattr(self.model, 'backbone'):
            return []
        used = ['backbone'] + (['neck'] if getattr(self.model, 'neck', None) is not None else [])
        if self.part == 'backbone':
            return used[:1]
        if self.part == 'model':
            used += [h for h in ('decode_head', 'bbox_head', 'rpn_head')
                     if hasattr(self.model, h)][:1]
        return used

    def fixed_size_reason(self) -> Optional[str]:
        """Why this part cannot have a dynamic height and width, or None."""
        if self.part != 'model':
            return None
        for name, module in self.model.named_modules():
            if isinstance(module, (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)):
                cells = module.output_size
                cells = (cells, cells) if isinstance(cells, int) else tuple(cells)
                if cells != (1, 1):
                    return (f'{name} pools adaptively to {cells} cells, which ONNX cannot '
                            'express for a dynamic input size')
        return None

    def output_names(self, example: torch.Tensor) -> List[str]:
        with torch.no_grad():
            count = len(self(example))
        prefix = {'backbone': 'feat', 'neck': 'neck', 'model': 'out'}[self.part]
        return [f'{prefix}{i}' for i in range(count)]


def check_sizes(batch: int, h: int, w: int, dynamic_hw: bool = True) -> List[Tuple[int, int, int]]:
    """(batch, height, width) to verify an export at: the export size, an odd size, and another
    batch at a third size (with a fixed size: the export size at three batches)."""
    if not dynamic_hw:
        return [(batch, h, w), (batch + 1, h, w), (batch + 2, h, w)]
    odd = (h * 3 // 4) | 1, (w * 5 // 4) | 1
    return [(batch, h, w), (batch, *odd), (batch + 1, h // 2 + 3, w // 2 + 9)]


def build_export_part(config: str, part: str, checkpoint: Optional[str] = None,
                      cfg_options: Optional[dict] = None, allow_pickle: bool = False
                      ) -> ExportPart:
    """Build the model of an mmdet/mmseg config on CPU in eval mode, weights as built unless
    ``checkpoint`` is given (no ``init_cfg`` file is read; what it may hold: ``weights.py``).
    The load report is the part's ``weights_report``."""
    from mmengine.registry import init_default_scope

    from ..engine.config import adapt_to_device, load_config, toolkit_of
    cfg = load_config(config, cfg_options)
    toolkit = toolkit_of(cfg)
    adapt_to_device(cfg)  # SyncBN -> BN on CPU
    init_default_scope(toolkit)
    if toolkit == 'mmdet':
        from mmdet.registry import MODELS
    else:
        from mmseg.registry import MODELS
    model = MODELS.build(cfg.model)
    export_part = ExportPart(model, part)
    export_part.weights_report = 'weights as built (no --checkpoint)'
    if checkpoint is not None:
        from .weights import load_export_weights
        export_part.weights_report = load_export_weights(
            model, checkpoint, export_part.children_used(), allow_pickle)
    return export_part.eval()


def export_onnx(module: nn.Module, example: torch.Tensor, path: str,
                exporter: str = DEFAULT_EXPORTER,
                opset: int = 18, output_names: Optional[Sequence[str]] = None,
                dynamic_hw: bool = True) -> None:
    """Export ``module`` (image batch -> tensors) with a dynamic batch and, if ``dynamic_hw``,
    dynamic height and width."""
    if exporter not in EXPORTERS:
        raise ValueError(f'exporter must be one of {EXPORTERS}, got {exporter!r}')
    if exporter == 'dynamo' and not HAS_DYNAMO_EXPORTER:
        raise ValueError(f'the dynamo exporter needs torch >= 2.5 (this is {torch.__version__}): '
                         "use exporter='classic'")
    module.eval()
    with torch.no_grad():
        outs = module(example)
    names = list(output_names or [f'out{i}' for i in range(len(outs))])
    if exporter == 'dynamo':
        batch = torch.export.Dim('batch', min=1, max=4096)
        height = torch.export.Dim('height', min=1, max=16384)
        width = torch.export.Dim('width', min=1, max=16384)
        dims = {0: batch, 2: height, 3: width} if dynamic_hw else {0: batch}
        torch.onnx.export(module, (example, ), path, dynamo=True, opset_version=opset,
                          input_names=['input'], output_names=names,
                          dynamic_shapes={'x': dims}, verbose=False)
    else:
        axes: Dict[str, Dict[int, str]] = {
            'input': {0: 'batch', 2: 'height', 3: 'width'} if dynamic_hw else {0: 'batch'}}
        for name, out in zip(names, outs):
            axes[name] = {d: f'{name}_dim{d}' for d in range(out.dim())
                          if d == 0 or (dynamic_hw and d != 1)}
        kwargs = {'dynamo': False} if HAS_DYNAMO_EXPORTER else {}  # no such argument before
        torch.onnx.export(module, (example, ), path, opset_version=opset, input_names=['input'],
                          output_names=names, dynamic_axes=axes, **kwargs)


def verify_onnx(path: str, module: nn.Module, inputs: Sequence[torch.Tensor],
                session=None) -> List[Dict]:
    """Run the file in ONNX Runtime on each input; per input, the max abs diff per output."""
    from .compare import verify
    from .runtimes import get_runtime
    if session is None:
        run = get_runtime('onnxruntime').load(path)
    else:
        name = session.get_inputs()[0].name

        def run(images):
            return session.run(None, {name: images})
    return verify(run, module, inputs)
