"""README.md and docs/*.md name only things that exist: tools, their flags and choices, make
targets, test paths, registered types, environment variables, files, links and headings; every
picture says which command, CPU and date made it.

What counts as a command (docs/development.md, "Documentation that stays true"): every line of a
fenced block without a language or marked bash/sh/shell (a trailing backslash continues it, #
starts a comment), the lines of a console block that start with "$ ", and inline code that
names a tool (`tools/train.py CONFIG --amp`) or starts with "make ". text blocks are output.
A tool's options are read from its own argparse parser, so nothing here repeats them.
"""
import argparse
import glob
import importlib.util
import os
import re
import shlex
from functools import lru_cache
from typing import Dict, List, Optional, Tuple

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ['README.md'] + sorted(os.path.relpath(p, ROOT)
                               for p in glob.glob(os.path.join(ROOT, 'docs', '*.md')))
COMMAND_LANGS = ('', 'bash', 'sh', 'shell')
PYTHONS = ('python', 'python3')
NOT_CHECKED = ('pip', 'git', 'cd', 'lscpu')  # other programs' commands: nothing of ours to check
FENCE = re.compile(r'^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[ \t]*\n(?P<body>.*?)^(?P=indent)```',
                   re.S | re.M)
INLINE = re.compile(r'(?<!`)`((?:[^`\n]|\n(?!\n))+)`(?!`)')  # within one paragraph
LINK = re.compile(r'!?\[[^\]]*\]\((?P<target>[^)\s]+)\)')
IMAGE = re.compile(r'!\[[^\]]*\]\((?P<target>[^)\s]+)\)')
REPO_PATH = re.compile(r'^(tools|configs|tests|swin_rpe_plugin|benchmarks|requirements|docs)/[\w./*{},-]*$')
TYPE = re.compile(r"""type\s*=\s*['"]swin_rpe_plugin\.(\w+)['"]""")
ENV_VAR = re.compile(r'\bSWIN_RPE_[A-Z0-9_]+\b')
DATE = re.compile(r'\b20\d\d-[01]\d-[0-3]\d\b')
CPU = re.compile(r'\b(AMD|EPYC|Ryzen|Intel|Xeon|Apple|Arm|ARM|Neoverse|Graviton)\b')


def read(page: str) -> str:
    with open(os.path.join(ROOT, page)) as f:
        return f.read()


def fences(text: str) -> List[Tuple[str, str]]:
    """(language, body) of each fenced block, the body dedented by the fence's indent."""
    blocks = []
    for m in FENCE.finditer(text):
        indent = len(m['indent'])
        body = '\n'.join(line[indent:] for line in m['body'].splitlines())
        blocks.append((m['lang'], body))
    return blocks


def prose(text: str) -> str:
    return FENCE.sub('', text)


def inline_code(text: str) -> List[str]:
    """The inline code spans outside fenced blocks, a line break inside one read as a space."""
    return [' '.join(span.split()) for span in INLINE.findall(prose(text))]


def joined_lines(body: str) -> List[str]:
    """Lines with backslash continuations joined."""
    lines, current = [], ''
    for line in body.splitlines():
        if line.rstrip().endswith('\\'):
            current += line.rstrip()[:-1] + ' '
        else:
            lines.append(current + line)
            current = ''
    if current:
        lines.append(current)
    return lines


def commands(text: str) -> List[str]:
    """Every command line of a page: fenced, console and inline (see the module docstring)."""
    found = []
    for lang, body in fences(text):
        if lang in COMMAND_LANGS:
            found += [line for line in joined_lines(body) if line.strip()]
        elif lang == 'console':
            found += [line[2:] for line in joined_lines(body) if line.startswith('$ ')]
    for span in inline_code(text):
        if re.search(r'(^|\s)tools/\S+\.(py|sh)\b', span) or span.startswith('make '):
            found.append(span)
    return found


def words(line: str) -> List[str]:
    """Shell words of a command, usage notation ([--opt], <placeholder>, a|b) reduced to words."""
    tokens = []
    for token in shlex.split(re.sub(r'<[^<>]*>', 'X', line), comments=True):
        token = token.lstrip('[')
        if '[' not in token:  # keep a pytest id's [17]
            token = token.rstrip(']')
        if token:
            tokens.append(token)
    return tokens


@lru_cache(maxsize=None)
def makefile_targets() -> Dict[str, List[str]]:
    """Each target of the Makefile with its recipe lines."""
    targets, current = {}, None
    for line in read('Makefile').splitlines():
        m = re.match(r'^([\w.-]+)\s*:(?!=)', line)
        if m and not line.startswith('.'):
            current = targets.setdefault(m[1], [])
        elif line.startswith('\t') and current is not None:
            current.append(line.strip())
    return targets


class _Reached(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__()
        self.parser = parser


@lru_cache(maxsize=None)
def tool_parser(tool: str) -> Optional[argparse.ArgumentParser]:
    """The argparse parser of ``tools/X.py`` (the one its ``parse_args`` or ``main`` builds), or,
    for a shell script, the parser of the Python tool it hands its options to (None: none)."""
    path = os.path.join(ROOT, tool)
    if tool.endswith('.sh'):
        with open(path) as f:
            handed = re.findall(r'\$HERE/(\w+\.py)', f.read())
        return tool_parser(f'tools/{handed[0]}') if handed else None
    spec = importlib.util.spec_from_file_location(f'_docs_tool_{os.path.basename(tool)[:-3]}',
                                                  path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # tools run their work only under __main__

    def reached(self, *args, **kwargs):
        raise _Reached(self)

    saved = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_known_args = reached
    try:
        (getattr(module, 'parse_args', None) or module.main)([])
    except _Reached as reached_parser:
        return reached_parser.parser
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = saved
    raise AssertionError(f'{tool}: neither parse_args() nor main() reached an argparse parser')


def option_problems(tool: str, args: List[str]) -> List[str]:
    """Flags the tool does not take, and values outside an option's choices."""
    parser = tool_parser(tool)
    options = parser._option_string_actions if parser else {}
    problems = []
    for i, arg in enumerate(args):
        if not arg.startswith('--'):
            continue
        flag, _, value = arg.partition('=')
        if flag not in options:
            problems.append(f'{tool} has no option {flag}')
            continue
        choices = options[flag].choices
        if not value and i + 1 < len(args) and not args[i + 1].startswith('-'):
            value = args[i + 1]
        if choices and value and not value.isupper():  # CONFIG-style placeholders pass
            problems += [f'{tool} {flag}: {v!r} is not one of {list(choices)}'
                         for v in value.split('|') if v not in map(str, choices)]
    return problems


def command_problems(line: str) -> List[str]:
    """Why a documented command would not run as written ([] when it would)."""
    args = words(line)
    while args and re.match(r'^[A-Z_][A-Z0-9_]*=', args[0]):
        args = args[1:]  # environment assignments (their names are checked separately)
    if args[:1] == ['flock']:
        args = args[2:]
    if not args:
        return []
    program = args[0]
    if program in PYTHONS or program.endswith('/python'):
        if args[1:2] == ['-m']:
            if args[2:3] != ['pytest']:
                return [f'python -m {args[2:3]}: only pytest is known here']
            paths = [a.split('::')[0] for a in args[3:] if not a.startswith('-')]
            return [f'pytest path {p} does not exist' for p in paths
                    if not os.path.exists(os.path.join(ROOT, p))]
        if args[1:2] == ['-c']:
            compile(args[2], line, 'exec')
            return []
        args = args[1:]
        program = args[0] if args else ''
    if program.startswith('tools/'):
        if not os.path.isfile(os.path.join(ROOT, program)):
            return [f'{program} does not exist']
        return option_problems(program, args[1:])
    if program == 'make':
        targets = makefile_targets()
        problems = []
        for arg in args[1:]:
            name, assign, value = arg.partition('=')
            if not assign:
                if name not in targets:
                    problems.append(f'make {name}: no such target in the Makefile')
                continue
            ran = [t for target in args[1:] if target in targets
                   for recipe in targets[target] for t in re.findall(r'tools/\w+\.py', recipe)
                   if f'$({name})' in recipe]
            if not ran:
                problems.append(f'make {arg}: no recipe of these targets reads $({name})')
            for tool in ran:
                problems += option_problems(tool, words(value))
        return problems
    if program in NOT_CHECKED:
        return []
    return [f'{program}: not a command these docs know; describe it in prose or in a text block']


@pytest.mark.parametrize('page', PAGES)
def test_every_documented_command_and_flag_exists(page):
    text = read(page)
    problems = [f'{line!r}: {p}' for line in commands(text) for p in command_problems(line)]
    assert not problems, f'{page}:\n' + '\n'.join(problems)


def test_commands_are_found_where_they_are_documented():
    """The reader of commands itself: fenced, continued, console and inline lines, not output."""
    text = ('```\n.venv/bin/python tools/a.py X \\\n    --b 1  # why\n```\n'
            '```console\n$ tools/c.sh --d\nan output line\n```\n'
            '```text\nerror: tools/e.py --f\n```\n'
            'Run `tools/g.py --h` or `make demo ARGS=--i`, not `--j`.\n')
    assert [words(line) for line in commands(text)] == [
        ['.venv/bin/python', 'tools/a.py', 'X', '--b', '1'], ['tools/c.sh', '--d'],
        ['tools/g.py', '--h'], ['make', 'demo', 'ARGS=--i']]
    assert command_problems('tools/train.py CONFIG --no-such-flag') == [
        'tools/train.py has no option --no-such-flag']
    assert command_problems('tools/export_onnx.py C --out m.onnx [--part backbone|hat]')[0] \
        .startswith("tools/export_onnx.py --part: 'hat' is not one of")
    assert command_problems('tools/dist_train.sh C 2 --amp --nope') == [
        'tools/dist_train.sh has no option --nope']
    assert command_problems('make nope') == ['make nope: no such target in the Makefile']
    assert command_problems('make demo ARGS="--arch v3"')[0].startswith(
        "tools/demo.py --arch: 'v3' is not one of")
    assert command_problems('.venv/bin/python -m pytest tests/nope.py::test_x') == [
        'pytest path tests/nope.py does not exist']
    assert command_problems('tools/nope.py')[0] == 'tools/nope.py does not exist'


@pytest.mark.parametrize('page', PAGES)
def test_python_blocks_compile_and_name_registered_types(page):
    from swin_rpe_plugin.registry import HOOKS, MODELS, OPTIM_WRAPPERS
    registered = set()
    for registry in (MODELS, HOOKS, OPTIM_WRAPPERS):
        registry.import_from_location()  # what a build would import first
        registered |= set(registry.module_dict)
    problems = []
    for lang, body in fences(read(page)):
        if lang == 'python':
            compile(body, page, 'exec')
            problems += [f'swin_rpe_plugin.{name} is not registered'
                         for name in TYPE.findall(body) if name not in registered]
    assert not problems, f'{page}: ' + '; '.join(problems)


@lru_cache(maxsize=None)
def code_text() -> str:
    files = [os.path.join(ROOT, 'Makefile')]
    for folder in ('swin_rpe_plugin', 'benchmarks', 'tools', 'tests'):
        files += glob.glob(os.path.join(ROOT, folder, '**', '*.py'), recursive=True)
        files += glob.glob(os.path.join(ROOT, folder, '**', '*.sh'), recursive=True)
    return '\n'.join(read(os.path.relpath(f, ROOT)) for f in files
                     if not f.endswith('test_docs.py'))


@pytest.mark.parametrize('page', PAGES)
def test_environment_variables_are_read_by_the_code(page):
    unknown = sorted(set(ENV_VAR.findall(read(page))) - set(ENV_VAR.findall(code_text())))
    assert not unknown, f'{page} names variables no code reads: {unknown}'


def heading_anchors(page: str) -> set:
    """GitHub's anchors of a page's headings."""
    anchors = set()
    for heading in re.findall(r'^#+ (.+)$', prose(read(page)), re.M):
        slug = re.sub(r'[^\w\- ]', '', heading.strip().lower().replace('`', ''))
        anchors.add(slug.replace(' ', '-'))
    return anchors


def expand_braces(path: str) -> List[str]:
    m = re.search(r'\{([^{}]*)\}', path)
    if not m:
        return [path]
    return [p for part in m[1].split(',')
            for p in expand_braces(path[:m.start()] + part + path[m.end():])]


@pytest.mark.parametrize('page', PAGES)
def test_links_paths_and_anchors_exist(page):
    text, here = read(page), os.path.dirname(page)
    problems = []
    for target in (m['target'] for m in LINK.finditer(prose(text))):
        if re.match(r'^[a-z]+:', target):
            continue  # a web address
        path, _, anchor = target.partition('#')
        linked = os.path.normpath(os.path.join(here, path)) if path else page
        if not os.path.exists(os.path.join(ROOT, linked)):
            problems.append(f'link {target}: {linked} does not exist')
        elif anchor and anchor not in heading_anchors(linked):
            problems.append(f'link {target}: {linked} has no heading #{anchor}')
    for span in inline_code(text):
        if REPO_PATH.match(span):
            for path in expand_braces(span):
                if not glob.glob(os.path.join(ROOT, path)):
                    problems.append(f'`{span}`: nothing at {path}')
    assert not problems, f'{page}:\n' + '\n'.join(problems)


@pytest.mark.parametrize('page', PAGES)
def test_every_picture_says_command_cpu_and_date(page):
    """The paragraph under a picture is its caption: it names the command (checked above as an
    inline command), the CPU model and the date that made it."""
    text = prose(read(page))
    problems = []
    for m in IMAGE.finditer(text):
        caption = text[m.end():].strip().split('\n\n')[0]
        spans = [s for s in inline_code(caption) if commands(f'`{s}`')]
        if not spans:
            problems.append(f"{m['target']}: its caption names no command (`tools/...`)")
        if not CPU.search(caption):
            problems.append(f"{m['target']}: its caption names no CPU model")
        if not DATE.search(caption):
            problems.append(f"{m['target']}: its caption has no date (YYYY-MM-DD)")
    assert not problems, f'{page}:\n' + '\n'.join(problems)


def test_readme_is_short_and_keeps_the_headline_markers():
    readme = read('README.md')
    assert len(readme.encode()) <= 10 * 1024, \
        f'README.md is {len(readme.encode())} bytes; move detail into docs/ (limit 10 KiB)'
    start, end = '<!-- headline:start -->', '<!-- headline:end -->'
    assert readme.count(start) == readme.count(end) == 1 and \
        readme.index(start) < readme.index(end), \
        f'README.md needs one {start} ... {end} pair (tools/benchmark.py --report fills it)'
