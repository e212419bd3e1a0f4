"""The rule that picks the compat and newest suites (tests/compat_suite.txt) leaves no part of the
package unrun on torch 2.1: every module imports on the torch running the tests, and every module
is imported by a test of the compat selection (or by a tool, config or module of ours that such a
test runs). tests/compat_suite.txt selects this file on every suite."""
import ast
import glob
import importlib
import importlib.util
import os
import pkgutil
import re
import subprocess
import sys

import swin_rpe_plugin
from conftest import ROOT, suite_rule

PACKAGE = 'swin_rpe_plugin'
TESTS = os.path.join(ROOT, 'tests')


def package_modules() -> list:
    return sorted(info.name for info in
                  pkgutil.walk_packages(swin_rpe_plugin.__path__, PACKAGE + '.'))


def test_every_module_of_the_package_imports(request):
    """On the compat and pinned torches every module imports. The newest environment has
    mmcv-lite and neither toolkit: there a module may miss a package that is not installed."""
    newest = request.config.getoption('suite') == 'newest'
    failures, absent = [], []
    modules = package_modules()
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:
            missing = (err.name or '').split('.')[0]
            if newest and missing and importlib.util.find_spec(missing) is None:
                absent.append(f'{name}: {missing} is not installed')
            else:
                failures.append(f'{name}: {type(err).__name__}: {err}')
        except Exception as err:  # noqa: BLE001  (every failure is reported, by module)
            failures.append(f'{name}: {type(err).__name__}: {err}')
    assert len(modules) > 40 and not failures, '\n'.join(failures)
    assert len(absent) < len(modules) // 4, absent


def imported_modules(path: str) -> set:
    """The package's modules a Python file imports from (anywhere in it), each name resolved to
    the module that defines it (``from swin_rpe_plugin.ops import window_attention`` is
    ``swin_rpe_plugin.ops.attention``), and the modules its strings name
    (``custom_imports``)."""
    with open(path) as f:
        source = f.read()
    found = set(re.findall(r"['\"](swin_rpe_plugin(?:\.\w+)*)['\"]", source))
    rel = os.path.relpath(path, ROOT)
    package = os.path.dirname(rel).replace(os.sep, '.') if rel.startswith(PACKAGE) else None
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(PACKAGE))
        elif isinstance(node, ast.ImportFrom):
            if node.level and package:  # a module of ours: from .x import y
                name = importlib.util.resolve_name('.' * node.level + (node.module or ''),
                                                   package)
            elif node.level:
                continue
            else:
                name = node.module or ''
            if not name.startswith(PACKAGE):
                continue
            module = importlib.import_module(name)
            for alias in node.names:
                obj = getattr(module, alias.name, None)
                if obj is None:
                    found.add(name)
                elif isinstance(obj, type(module)):
                    found.add(obj.__name__)
                else:
                    owner = getattr(obj, '__module__', None) or name
                    found.add(owner if owner.startswith(PACKAGE) else name)
    return found


def files_run_by(path: str, files=None) -> set:
    """The tools and configs a test file names, and the tools a shell tool runs."""
    files = set() if files is None else files
    with open(path) as f:
        text = f.read()
    for rel in re.findall(r'\b((?:tools|configs)/[\w./-]+\.(?:py|sh))\b', text):
        full = os.path.join(ROOT, rel)
        if os.path.isfile(full) and full not in files:
            files.add(full)
            if full.endswith('.sh'):
                files_run_by(full, files)
    return files


def compat_selection(request) -> list:
    """The node ids of the compat suite: this session's when it is the whole compat suite,
    else as `make test-compat` collects them."""
    config = request.config
    wanted = {p for p in glob.glob(os.path.join(TESTS, '**', 'test_*.py'), recursive=True)
              if not p.startswith(os.path.join(TESTS, 'benchmarks') + os.sep)}
    if config.getoption('suite') == 'compat' and wanted <= config.collected_test_files:
        return config.suite_selection
    proc = subprocess.run(
        [sys.executable, '-m', 'pytest', '--collect-only', '-q', '-p', 'no:cacheprovider',
         '--suite', 'compat', 'tests', '--ignore=tests/benchmarks', '-m', 'not harness'],
        cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [line for line in proc.stdout.splitlines() if '::' in line]


def defines_code(module: str) -> bool:
    """Whether a module defines a function or class: one that holds only constants
    (version.py) and package __init__ files run on import, which the first test checks."""
    origin = importlib.util.find_spec(module).origin
    if origin.endswith('__init__.py'):
        return False
    with open(origin) as f:
        body = ast.parse(f.read()).body
    return any(isinstance(n, (ast.FunctionDef, ast.ClassDef)) for n in body)


def test_the_compat_selection_runs_every_module_of_the_package(request):
    """A module counts as run when a test of the compat selection imports from it, or a tool or
    config that test names does, or a module that counts imports it (package __init__ files
    pass nothing on: ``import swin_rpe_plugin`` alone runs no feature). A module that fails
    here needs a line in tests/compat_suite.txt that selects a test of it."""
    selected = compat_selection(request)
    test_files = {os.path.join(ROOT, nodeid.split('::')[0]) for nodeid in selected}
    assert len(selected) > 100 and len(test_files) > 20, (len(selected), len(test_files))
    run = set()
    for path in test_files:
        for source in {path} | files_run_by(path):
            if source.endswith('.py'):
                run |= imported_modules(source)
    todo = [m for m in run if m != PACKAGE]
    while todo:  # what an imported module imports runs when it does
        spec = importlib.util.find_spec(todo.pop())
        if spec is None or not spec.origin or spec.origin.endswith('__init__.py'):
            continue
        for module in imported_modules(spec.origin) - run:
            run.add(module)
            todo.append(module)
    unrun = [m for m in package_modules() if m not in run and defines_code(m)]
    assert not unrun, ('modules no test of the compat selection runs (tests/compat_suite.txt): '
                       + ', '.join(unrun))


def test_the_rule_names_existing_tests_and_every_tool_of_the_readme(request):
    """Every path line names a test file or folder; every tool README.md names, or `make demo`
    runs, is named by a test of the compat selection, or is a harness line's."""
    rule = suite_rule()
    for kind, pattern, _ in rule:
        if kind == 'path':
            assert os.path.exists(os.path.join(ROOT, pattern)), pattern
        elif kind in ('code', 'toolkit'):
            re.compile(pattern)
    with open(os.path.join(ROOT, 'README.md')) as f:
        readme = f.read()
    demo = ''.join(open(os.path.join(ROOT, p)).read()
                   for p in ('tools/demo.py', 'swin_rpe_plugin/engine/demo.py'))
    tools = set(re.findall(r'tools/\w+\.(?:py|sh)', readme + demo)) | {'tools/demo.py'}
    assert 'tools/train.py' in tools and 'tools/test.py' in tools, tools
    harness = {pattern for kind, pattern, _ in rule if kind == 'harness'}
    named = ''
    for path in {nodeid.split('::')[0] for nodeid in compat_selection(request)}:
        with open(os.path.join(ROOT, path)) as f:
            named += f.read()
    unrun = [t for t in sorted(tools - harness) if t not in named]
    assert not unrun, f'tools of the README no test of the compat selection runs: {unrun}'


class FakeWorker:
    """What xdist's scheduler asks of a worker: an id, tests to run (collection indices)."""
    shutting_down = False

    def __init__(self, name):
        self.gateway = type('Gateway', (), {'id': name})()
        self.sent = []

    def send_runtest_some(self, indices):
        self.sent.extend(indices)

    def shutdown(self):
        pass


def test_workers_get_whole_files_in_the_collection_order():
    """`make test`'s `--dist loadfile` hands whole files out in the order tests/conftest.py
    collected them (heavy files first), with the installed xdist's own scheduler: 3.7+ with
    `--no-loadscope-reorder`, 3.6.1 (Python 3.8) through conftest's pytest_xdist_make_scheduler;
    xdist's default queues the files with most tests first."""
    import xdist
    from conftest import pytest_xdist_make_scheduler
    from xdist.scheduler import LoadFileScheduling
    option = type('Option', (), {'dist': 'loadfile'})()
    if tuple(int(p) for p in xdist.__version__.split('.')[:2]) >= (3, 7):
        option.loadscopereorder = False  # --no-loadscope-reorder, as the Makefile passes
    config = type('Config', (), {'option': option, 'getoption': lambda self, name: 'loadfile',
                                 'getvalue': lambda self, name: ['2*popen']})()
    scheduler = pytest_xdist_make_scheduler(config, None) or LoadFileScheduling(config)
    collection = ['tests/heavy.py::test_a', 'tests/few.py::test_a', 'tests/few.py::test_b',
                  'tests/many.py::test_a', 'tests/many.py::test_b', 'tests/many.py::test_c']
    workers = [FakeWorker('gw0'), FakeWorker('gw1')]
    for worker in workers:
        scheduler.add_node(worker)
        scheduler.add_node_collection(worker, collection)
    scheduler.schedule()
    first = [collection[w.sent[0]].split('::')[0] for w in workers]
    assert first == ['tests/heavy.py', 'tests/few.py'], first
