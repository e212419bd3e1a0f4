"""No test reads outside the repository: a clone with nothing beside it runs the whole suite.

A static guard over every Python file under tests/: the ways the suite once climbed out of the
checkout (a join of ``os.path.dirname(ROOT)`` with the sibling folder, or the old override variable)
and their near relatives (``..`` path parts, ``os.pardir``, ``Path(ROOT).parent``, ``/work/...``).
Docstrings are prose and are not scanned (the fixture scripts' docstrings name the folders their
reference libraries were installed in). The guard is tested on planted sources first, so it
cannot pass by finding nothing.
"""
import ast
import os

import pytest

# The sibling folder's name, spelt in pieces: a text search of tests/ for it then finds only
# real uses, not this guard's own patterns and planted examples.
SIBLING = 'sha' + 'red'

from conftest import ROOT

TESTS = os.path.join(ROOT, 'tests')
HERE = os.path.abspath(__file__)


def _docstrings(tree):
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _is_root(node):
    """ROOT, or Path(ROOT) / pathlib.Path(ROOT)."""
    if isinstance(node, ast.Name):
        return node.id == 'ROOT'
    return (isinstance(node, ast.Call) and len(node.args) == 1 and _is_root(node.args[0])
            and getattr(node.func, 'attr', getattr(node.func, 'id', None)) == 'Path')


def outside_references(source):
    """(line, what) for each reference to a path outside the repository in a Python source."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) in docstrings:
                continue
            text = node.value
            parts = set(text.replace('\\', '/').split('/'))
            if '..' in parts:
                found.append((node.lineno, f'{text!r}: a ".." path part'))
            if SIBLING in parts:
                found.append((node.lineno, f'{text!r}: a {SIBLING!r} path part'))
            if 'SWIN_RPE_' + SIBLING.upper() in text:
                found.append((node.lineno, f'{text!r}: the old sibling-folder override'))
            if text.startswith('/work'):
                found.append((node.lineno, f'{text!r}: the workplace above the checkout'))
        elif isinstance(node, (ast.Attribute, ast.Name)):
            if getattr(node, 'attr', getattr(node, 'id', None)) == 'pardir':
                found.append((node.lineno, 'os.pardir'))
            if isinstance(node, ast.Attribute) and node.attr == 'parent' and _is_root(node.value):
                found.append((node.lineno, 'the parent of ROOT'))
        elif isinstance(node, ast.Call):
            name = getattr(node.func, 'attr', getattr(node.func, 'id', None))
            if name == 'dirname' and node.args and _is_root(node.args[0]):
                found.append((node.lineno, 'os.path.dirname(ROOT)'))
    return found


PLANTED = [(source.replace('{S}', SIBLING).replace('{V}', 'SWIN_RPE_' + SIBLING.upper()), n)
           for source, n in [
    ("FOLDER = os.path.join(os.path.dirname(ROOT), '{S}')", 2),  # climbs, then the sibling
    ("FOLDER = os.environ.get('{V}', 'x')", 1),
    ("path = os.path.join(ROOT, os.pardir, 'fixtures')", 1),
    ("path = os.path.join(ROOT, '..', 'fixtures')", 1),
    ("path = ROOT + '/../{S}/fixtures/a.json'", 2),
    ("path = pathlib.Path(ROOT).parent / 'data'", 1),
    ("path = '/work/{S}/reference/swin_rpe_reference.json'", 2),
]]


@pytest.mark.parametrize('source,count', PLANTED)
def test_guard_finds_planted_references(source, count):
    assert len(outside_references(source)) == count, outside_references(source)


def test_guard_passes_paths_inside_and_prose():
    source = (f'"""Made from ../{SIBLING} once; see /work/ref/hf5."""\n'
              "FIXTURES = os.path.join(ROOT, 'tests', 'fixtures', 'swin')\n"
              "ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))\n"
              "bad = '/nope/x.pth'  # a path that is meant not to exist\n")
    assert outside_references(source) == []


def python_files():
    for folder, _, names in os.walk(TESTS):
        for name in sorted(names):
            path = os.path.join(folder, name)
            if name.endswith('.py') and os.path.abspath(path) != HERE:  # this file plants examples on purpose
                yield path


def test_no_python_file_under_tests_refers_outside_the_repository():
    files = list(python_files())
    assert len(files) > 20  # the scan saw the suite (not an empty or wrong folder)
    found = {}
    for path in files:
        with open(path) as f:
            refs = outside_references(f.read())
        if refs:
            found[os.path.relpath(path, ROOT)] = refs
    assert not found, found
