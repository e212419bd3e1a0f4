import json
import os
import socket
import uuid

import pytest
import torch
from mmengine.model import BaseModel
from mmengine.runner import Runner

from swin_rpe_plugin import SwinTransformer, compat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(ROOT, 'tests', 'fixtures', 'reference', 'swin_rpe_reference.json')


@pytest.fixture(scope='session')
def reference():
    """The worked numbers of the design documents (ground truth, never regenerated; see
    tests/fixtures/reference/README.md)."""
    with open(REFERENCE) as f:  # a missing file is a failure, not a skip
        return json.load(f)


def pytest_configure(config):
    """Under pytest-xdist (`make test` runs 2 workers), each worker gets its share of the cores:
    two workers of two OpenMP threads each on 2 cores spin against each other (see
    test_fuzz.py), and the tools a test starts in a subprocess inherit the share."""
    workers = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '0'))
    if workers > 1:
        threads = max(1, len(os.sched_getaffinity(0)) // workers)
        torch.set_num_threads(threads)
        os.environ['OMP_NUM_THREADS'] = str(threads)


def _known_failures() -> dict:
    path = os.path.join(ROOT, 'tests', 'compat_known_failures.txt')
    with open(path) as f:
        rows = [line.split(' | ', 1) for line in f if line.strip() and not line.startswith('#')]
    return {node.strip(): why.strip() for node, why in rows}


KNOWN_FAILURES_TORCH_2_1 = _known_failures()


def pytest_collection_modifyitems(config, items):
    """Tests of a feature this torch lacks (``@pytest.mark.needs('HAS_CUSTOM_OP')``, names as
    in ``swin_rpe_plugin.compat``) are deselected, and counted as such: on torch 2.1 there is
    no registered op to check. Then files marked ``heavy`` (minutes each) first, the rest in
    their order: `make test` hands whole files to its workers in this order
    (``--no-loadscope-reorder``), so the run ends on short files instead of one worker
    finishing a heavy file alone while the other idles."""
    if compat.TORCH_VERSION <= (2, 1):  # the oldest environment's known failures
        for item in items:
            if item.nodeid in KNOWN_FAILURES_TORCH_2_1:
                item.add_marker(pytest.mark.xfail(
                    strict=True, reason=KNOWN_FAILURES_TORCH_2_1[item.nodeid]))
    lacking = [item for item in items if any(not getattr(compat, m.args[0])
                                             for m in item.iter_markers('needs'))]
    if lacking:
        config.hook.pytest_deselected(items=lacking)
        items[:] = [item for item in items if item not in lacking]
    items.sort(key=lambda item: item.get_closest_marker('heavy') is None)


def free_port() -> int:
    """A TCP port nothing listens on now, for a gloo rendezvous: a fixed port would collide
    when two test workers start distributed runs at once."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.fixture(autouse=True, scope='module')
def _fresh_compiler_caches():
    """Each test file starts with dynamo's caches empty. Compiled code is cached per Python code
    object for the whole process: after one file compiles the backbone's functions at many
    sizes, the next file's compiles meet the recompile limit and are split into many small
    graphs (models/test_compile.py's first test took 398 s after
    ops/test_compiled_fast_paths.py instead of 19 s), so a file's cost would depend on which
    files ran before it in its process."""
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


class TinyClassifier(BaseModel):
    """Our backbone + a linear head: the smallest model an mmengine Runner trains and saves."""

    def __init__(self, backbone_cfg: dict):
        super().__init__()
        self.backbone = SwinTransformer(**backbone_cfg)
        self.head = torch.nn.Linear(self.backbone.out_channels[-1], 2)

    def forward(self, inputs, labels=None, mode='tensor'):
        logits = self.head(self.backbone(inputs)[-1].mean((2, 3)))
        if mode == 'loss':
            return {'loss': torch.nn.functional.cross_entropy(logits, labels)}
        return logits


def salient_bias_tables(model: torch.nn.Module) -> torch.nn.Module:
    """Draw every relative position bias table from N(0, 1), in place: tables that matter, so a
    wrong bias index or attention mask shows in the outputs (the init's are zero or near it)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if 'relative_position_bias_table' in name:
                p.normal_(0, 1.0)
    return model


def tiny_runner(work_dir, max_iters: int, backbone_cfg: dict, image_size: int,
                checkpoint_interval: int, **kwargs) -> Runner:
    """A Runner on 4 random images that saves real mmengine checkpoints (meta, message hub).

    Each gets its own experiment name: mmengine names one by the second it starts, and runners
    started in the same second in one process share a MessageHub (and its logged losses)."""
    kwargs.setdefault('experiment_name', f'tiny-{uuid.uuid4().hex}')
    data = [dict(inputs=torch.randn(3, image_size, image_size), labels=torch.tensor(i % 2))
            for i in range(4)]
    return Runner(
        model=TinyClassifier(backbone_cfg), work_dir=str(work_dir),
        train_dataloader=dict(dataset=data, batch_size=2, collate_fn=dict(type='default_collate'),
                              sampler=dict(type='DefaultSampler', shuffle=False)),
        optim_wrapper=dict(optimizer=dict(type='AdamW', lr=1e-3)),
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=checkpoint_interval,
                                           by_epoch=False),
                           logger=dict(type='LoggerHook', interval=1)),
        randomness=dict(seed=0), **kwargs)


def short(iters, warmup=2, batch=4):
    """Config options for a short run of a synthetic config: warm-up then linear decay, no
    validation, log every 2 iterations, one checkpoint at the end."""
    return {'train_cfg.max_iters': iters, 'param_scheduler.0.end': warmup,
            'param_scheduler.1.begin': warmup, 'param_scheduler.1.end': iters,
            'default_hooks.checkpoint.interval': iters, 'default_hooks.logger.interval': 2,
            'train_dataloader.batch_size': batch, 'val_cfg': None, 'val_dataloader': None,
            'val_evaluator': None}
