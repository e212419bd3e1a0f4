"""The installed package holds what users import: the harness in benchmarks/ measures it from a
clone, is not installed (setup.py's packages), and nothing in the package imports it."""
import ast
import glob
import os

from setuptools import find_packages

from conftest import ROOT


def imported_modules(path):
    with open(path) as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def test_nothing_in_the_package_imports_the_harness_or_the_tests():
    files = glob.glob(os.path.join(ROOT, 'swin_rpe_plugin', '**', '*.py'), recursive=True)
    assert len(files) > 20  # the scan saw the package
    found = {os.path.relpath(path, ROOT): name for path in files
             for name in imported_modules(path) if name.split('.')[0] in ('benchmarks', 'tests')}
    assert not found, found


def setup_packages_call() -> ast.Call:
    with open(os.path.join(ROOT, 'setup.py')) as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == 'packages':
            return node.value
    raise AssertionError('setup.py names no packages=')


def test_setup_installs_the_package_and_not_the_harness():
    """setup.py's ``packages=find_packages(include=[...])``, evaluated in this checkout."""
    call = setup_packages_call()
    assert isinstance(call, ast.Call) and getattr(call.func, 'id', None) == 'find_packages'
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    packages = find_packages(ROOT, **kwargs)
    assert 'swin_rpe_plugin' in packages and 'swin_rpe_plugin.ops' in packages
    assert not [p for p in packages if not p.startswith('swin_rpe_plugin')], packages
    assert os.path.isfile(os.path.join(ROOT, 'benchmarks', '__init__.py'))  # a package, not installed
