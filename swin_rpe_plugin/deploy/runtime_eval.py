"""A detector's or segmentor's test-set metrics with its backbone (+ neck) run by a runtime.

The model, data, pipeline and evaluator are the config's, built by mmengine's Runner as
tools/test.py builds them; only ``model.backbone`` is replaced by a module that runs the
exported file (for ``'neck'``: the file holds backbone + neck and ``model.neck`` becomes None, so
``extract_feat`` returns the file's outputs). The heads, post-processing and metric stay eager.
"""
from typing import Callable, Dict, List, Optional

import numpy as np
import torch
import torch.nn as nn


class RuntimePart(nn.Module):
    """Stands in for a backbone: images -> the runtime's outputs as tensors."""

    def __init__(self, run: Callable[[np.ndarray], List[np.ndarray]]):
        super().__init__()
        self.run = run

    def forward(self, x: torch.Tensor):
        return tuple(torch.from_numpy(o) for o in self.run(x.detach().float().numpy()))


def replace_part(model: nn.Module, part: str, run: Callable) -> Dict[str, Optional[nn.Module]]:
    """Put ``run`` in the place of ``part`` ('backbone' or 'neck' = backbone + neck); returns
    the modules taken out, for ``restore_part``."""
    if part not in ('backbone', 'neck'):
        raise ValueError(f"a runtime can stand in for 'backbone' or 'neck', not {part!r}")
    taken = {'backbone': model.backbone}
    model.backbone = RuntimePart(run)
    if part == 'neck':
        taken['neck'] = model.neck
        model.neck = None
    return taken


def restore_part(model: nn.Module, taken: Dict[str, Optional[nn.Module]]) -> None:
    for name, module in taken.items():
        setattr(model, name, module)


def build_test_runner(config: str, checkpoint: str, work_dir: str,
                      data_root: Optional[str] = None, cfg_options: Optional[dict] = None):
    """tools/test.py's Runner with ``checkpoint`` loaded into its model."""
    from ..engine.run import build_runner, check_checkpoint_fits, prepare
    cfg = prepare(config, work_dir, cfg_options, 'none', 'test', data_root)
    cfg.load_from = checkpoint
    runner = build_runner(cfg)
    check_checkpoint_fits(runner.model, checkpoint)
    runner.load_or_resume()
    return runner


def test_metrics(runner) -> Dict[str, float]:
    metrics = runner.test()
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}


def metrics_with_runtime(runner, part: str, run: Callable) -> Dict[str, float]:
    """The runner's test metrics with ``part`` run by ``run``; the model is restored after."""
    taken = replace_part(runner.model, part, run)
    try:
        return test_metrics(runner)
    finally:
        restore_part(runner.model, taken)
