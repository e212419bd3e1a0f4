"""pip behaves in the environment that runs the tests: ``pip install .`` and ``pip install -e .``
with dependencies resolve to this package alone, keeping the environment's torch, mmcv and
mmengine (pip would otherwise download a torch, or build mmcv from source for an hour).

pip's own resolver answers, through ``--dry-run --report``: what it would install, with the
environment as it is, and nothing changed."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize('editable', [False, True], ids=['install', 'editable'])
def test_pip_install_keeps_torch_mmcv_and_mmengine(tmp_path, editable):
    report = tmp_path / 'report.json'
    target = ['-e', ROOT] if editable else [ROOT]
    subprocess.run([sys.executable, '-m', 'pip', 'install', '--dry-run', '--quiet',
                    '--disable-pip-version-check', '--report', str(report), *target],
                   check=True, cwd=tmp_path, capture_output=True, text=True)
    items = json.loads(report.read_text())['install']
    would_install = {item['metadata']['name'].lower().replace('_', '-') for item in items}
    assert 'swin-rpe-plugin' in would_install
    # The stack stays as it is. (The pinned .venv keeps setuptools 69 for mmcv's build while
    # torch 2.13 declares setuptools >= 77, so there pip would also bring a newer setuptools:
    # a wheel, nothing built.)
    assert not would_install & {'torch', 'mmcv', 'mmcv-lite', 'mmengine', 'numpy', 'triton'}, \
        would_install
    assert not any(name.startswith('nvidia-') for name in would_install), would_install
    built = [item['metadata']['name'] for item in items
             if item['metadata']['name'] != 'swin_rpe_plugin'
             and not item['download_info']['url'].endswith('.whl')]
    assert not built, f'pip would build {built} from source'
