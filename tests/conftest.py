import ast
import collections
import functools
import io
import json
import os
import re
import socket
import tokenize
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


SUITE_RULE = os.path.join(ROOT, 'tests', 'compat_suite.txt')


def pytest_addoption(parser):
    parser.addoption('--suite', choices=('all', 'compat', 'newest'), default='all',
                     help='all: every test (make test); compat, newest: the tests of what differs '
                          'between torch versions, by the rule in tests/compat_suite.txt')


def suite_rule(path: str = SUITE_RULE) -> list:
    """The lines of tests/compat_suite.txt as (kind, pattern, why)."""
    rows = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip() or line.startswith('#'):
                continue
            parts = [p.strip() for p in line.split(' | ')]
            if len(parts) != 3 or parts[0] not in ('path', 'marker', 'code', 'toolkit',
                                                   'harness'):
                raise ValueError(f'{path}:{number}: want "kind | pattern | why" with kind '
                                 f'path, marker, code, toolkit or harness: {line.strip()!r}')
            rows.append(tuple(parts))
    return rows


def _code_only(source: str) -> str:
    """``source`` with its comments and docstrings blanked (lines kept where they were)."""
    lines = source.splitlines(keepends=True)
    blank = []  # (row, first col, last row, end col) spans to blank, 1-based rows
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            blank.append((*token.start, *token.end))
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, 'body', None)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and body and isinstance(body[0], ast.Expr) \
                and isinstance(getattr(body[0], 'value', None), ast.Constant) \
                and isinstance(body[0].value.value, str):
            doc = body[0]
            blank.append((doc.lineno, doc.col_offset, doc.end_lineno, doc.end_col_offset))
    out = [list(line) for line in lines]
    for row, col, end_row, end_col in blank:
        for r in range(row, end_row + 1):
            line = out[r - 1]
            first = col if r == row else 0
            last = end_col if r == end_row else len(line) - (1 if line[-1:] == ['\n'] else 0)
            line[first:last] = ' ' * (last - first)
    return ''.join(''.join(line) for line in out)


@functools.lru_cache(maxsize=None)
def _module_names(path: str) -> dict:
    """{top-level name: (its code, the names it uses, (file, name) an import points at)} for
    one Python file: functions and classes with their decorators, assignments, imports."""
    with open(path) as f:
        source = f.read()
    code = _code_only(source).splitlines()
    names = {}
    for node in ast.parse(source).body:
        first = min([node.lineno] + [d.lineno for d in getattr(node, 'decorator_list', [])])
        text = '\n'.join(code[first - 1:node.end_lineno])
        used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = (text, used, None)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        names[n.id] = (text, used, None)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            helper = None
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for folder in (os.path.dirname(path), os.path.join(ROOT, 'tests')):
                    candidate = os.path.join(folder, node.module.replace('.', os.sep) + '.py')
                    if os.path.isfile(candidate):
                        helper = candidate
                        break
            for alias in node.names:
                name = (alias.asname or alias.name).split('.')[0]
                names[name] = (text, set(), (helper, alias.name) if helper else None)
    return names


def _top_level_imports(path: str) -> str:
    return '\n'.join(text for text, _, _ in _module_names(path).values()
                     if text.lstrip().startswith(('import ', 'from ')))


def test_code(item) -> str:
    """The code of a test as tests/compat_suite.txt defines it: its function, the fixtures it
    requests (not the autouse ones of this file), and the module-level names these use, in
    their files and the helper files of tests/ they import from, transitively."""
    todo = [(str(item.path), item.function.__name__)]
    autouse = {'_fresh_compiler_caches', '_seed'}
    for name in item.fixturenames:
        for fixturedef in item._fixtureinfo.name2fixturedefs.get(name, ()):
            func = getattr(fixturedef, 'func', None)
            path = getattr(getattr(func, '__code__', None), 'co_filename', '')
            if path.startswith(os.path.join(ROOT, 'tests')) and name not in autouse:
                todo.append((path, getattr(func, '__name__', name)))
    seen, texts = set(), []
    while todo:
        path, name = todo.pop()
        if (path, name) in seen:
            continue
        seen.add((path, name))
        entry = _module_names(path).get(name)
        if entry is None:
            continue
        text, used, target = entry
        texts.append(text)
        todo.extend((path, n) for n in used)
        if target is not None:
            todo.append(target)
    return '\n'.join(texts)


def suite_reasons(item, rule) -> list:
    """The lines of the rule that select ``item`` (empty: not in the compat or newest suite)."""
    code = None
    reasons = []
    for kind, pattern, why in rule:
        if kind == 'path':
            hit = item.nodeid.startswith(pattern)
        elif kind == 'marker':
            hit = item.get_closest_marker(pattern) is not None
        elif kind == 'code':
            code = test_code(item) if code is None else code
            hit = re.search(pattern, code) is not None
        else:
            continue
        if hit:
            reasons.append(f'{kind} {pattern}')
    return reasons


def needs_toolkit(item, rule) -> bool:
    code = test_code(item) + '\n' + _top_level_imports(str(item.path))
    return any(re.search(pattern, code) for kind, pattern, _ in rule if kind == 'toolkit')


def pytest_ignore_collect(collection_path, config):
    """Under --suite newest, a test file whose top-level imports need a toolkit is not
    imported (mmcv-lite there: no mmdet, no mmseg)."""
    path = str(collection_path)
    if config.getoption('suite') != 'newest' or not (
            os.path.basename(path).startswith('test_') and path.endswith('.py')):
        return None
    imports = _top_level_imports(path)
    if any(re.search(pattern, imports) for kind, pattern, _ in suite_rule() if kind == 'toolkit'):
        return True
    return None


def select_suite(config, items):
    """--suite compat/newest: keep the tests tests/compat_suite.txt selects; report the rest as
    deselected."""
    suite = config.getoption('suite')
    config.collected_test_files = {str(item.path) for item in items}
    config.suite_selection = None
    if suite == 'all':
        return
    rule = suite_rule()
    keep = [item for item in items if suite_reasons(item, rule)
            and not (suite == 'newest' and needs_toolkit(item, rule))]
    kept = set(map(id, keep))
    dropped = [item for item in items if id(item) not in kept]
    config.suite_selection = [item.nodeid for item in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_collection_modifyitems(config, items):
    """Tests of a feature this torch lacks (``@pytest.mark.needs('HAS_CUSTOM_OP')``, names as
    in ``swin_rpe_plugin.compat``) are deselected, and counted as such: on torch 2.1 there is
    no registered op to check. Then files marked ``heavy`` (minutes each) first, the rest in
    their order: `make test` hands whole files to its workers in this order
    (``--no-loadscope-reorder``; pytest_xdist_make_scheduler below where xdist lacks it), so
    the run ends on short files instead of one worker finishing a heavy file alone while the
    other idles."""
    select_suite(config, items)
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


class CollectionOrderQueue(collections.OrderedDict):
    """pytest-xdist's queue of test files (file -> its tests), handing out first the file that
    comes first in the collection, whatever order the files were queued in."""

    def __init__(self, scheduler):
        super().__init__()
        self.scheduler = scheduler

    def popitem(self, last=True):
        if last:
            return super().popitem(last=True)
        rank = {}
        for nodeid in self.scheduler.collection:
            rank.setdefault(nodeid.split('::', 1)[0], len(rank))
        first = min(self, key=rank.__getitem__)
        return first, self.pop(first)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` in the collection's order (heavy files first, above) where xdist has no
    `--no-loadscope-reorder`: 3.6.1, the last for Python 3.8 (.venv-compat), queues the files
    with most tests first, which left the compile tests to the end of the compat suite, on one
    worker while the other idled."""
    if config.getoption('dist') != 'loadfile' or hasattr(config.option, 'loadscopereorder'):
        return None  # xdist's own scheduling
    from xdist.scheduler import LoadFileScheduling
    scheduler = LoadFileScheduling(config, log)
    scheduler.workqueue = CollectionOrderQueue(scheduler)
    return scheduler


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
