"""tools/cxx_with_pch.sh, the compiler tools/setup_env.sh builds mmcv's ops with: called the way
torch's ninja build calls the compiler, it precompiles the common header once, every compile
that includes it first reads the precompiled header, and the objects are the ones the plain
compiler makes (the same instructions); a link passes through."""
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WRAPPER = os.path.join(ROOT, 'tools', 'cxx_with_pch.sh')

HEADER = '''#ifndef PYTORCH_CPP_HELPER
#define PYTORCH_CPP_HELPER
#include <map>
#include <string>
inline int helper_value(const std::string& s) {
  std::map<std::string, int> m{{"a", 41}};
  return m[s] + (s.size() == 1 ? 1 : 0);
}
#endif
'''
SOURCES = {
    'ops.cpp': '#include "pytorch_cpp_helper.hpp"\nint op() { return helper_value("a"); }\n',
    'main.cpp': '#include "pytorch_cpp_helper.hpp"\nint op();\n'
                'int main() { return op() == 42 && helper_value("b") == 1 ? 0 : 1; }\n',
}


FLAGS = ['-O2', '-fPIC']
POST_FLAGS = ['-std=c++17', '-DEXT_NAME=_ext']


def ninja_compile(tmp_path, source, obj):
    """torch's ninja rule: $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags (its cflags
    end in a stray -c of their own)."""
    return ['-MMD', '-MF', obj + '.d', *FLAGS, f'-I{tmp_path / "common"}', '-c', '-c', source,
            '-o', obj, *POST_FLAGS]


def disassembly(obj):
    out = subprocess.run(['objdump', '-d', '--no-show-raw-insn', obj], check=True,
                         capture_output=True, text=True).stdout
    return out.split('\n', 2)[2]  # past the line naming the file


def test_precompiles_once_and_compiles_the_same_objects(tmp_path):
    (tmp_path / 'common').mkdir()
    (tmp_path / 'common' / 'pytorch_cpp_helper.hpp').write_text(HEADER)
    (tmp_path / 'src').mkdir()
    (tmp_path / 'build').mkdir()
    for name, text in SOURCES.items():
        (tmp_path / 'src' / name).write_text(text)
    pch = tmp_path / 'pch'
    env = dict(os.environ, CXX_WITH_PCH_DIR=str(pch))
    objects = []
    for name in SOURCES:
        source, obj = str(tmp_path / 'src' / name), str(tmp_path / 'build' / (name + '.o'))
        proc = subprocess.run([WRAPPER, *ninja_compile(tmp_path, source, obj), '-H'], env=env,
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        # -H: GCC marks a precompiled header it used with '!'
        assert f'! {pch}/pytorch_cpp_helper.hpp.gch' in proc.stderr.splitlines(), proc.stderr
        assert os.path.exists(obj + '.d')
        plain = obj + '.plain'
        subprocess.run(['c++', *FLAGS, f'-I{tmp_path / "common"}', '-c', source, '-o', plain,
                        *POST_FLAGS], check=True)
        assert disassembly(obj) == disassembly(plain)
        objects.append(obj)
    assert sorted(os.listdir(pch)) == ['lock', 'pytorch_cpp_helper.hpp',
                                       'pytorch_cpp_helper.hpp.gch']
    program = str(tmp_path / 'program')
    subprocess.run([WRAPPER, *objects, '-o', program], env=env, check=True)
    assert subprocess.run([program]).returncode == 0
