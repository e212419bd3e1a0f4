"""tools/kernel_rule_cost.py: every linear of the backbone, timed in both libraries."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.harness  # tools/kernel_rule_cost.py measures for the rules (pinned env)
def test_kernel_rule_cost_lists_every_linear_of_the_backbone(tmp_path):
    out = tmp_path / 'cost.json'
    proc = subprocess.run([sys.executable, 'tools/kernel_rule_cost.py', '--shape', '32', '32',
                           '--batch', '1', '--repeats', '1', '--json', str(out)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    records = result['records']
    # Swin-T: 4 linears per block (qkv, proj, fc1, fc2) x 2 directions per stage, 3 merges x 2
    assert len(records) == 4 * 8 + 3 * 2
    assert sum(r['count'] for r in records if r['name'].endswith('qkv')) == 2 + 2 + 6 + 2
    first = records[0]
    assert (first['rows'], first['k'], first['n']) == (8 * 8, 96, 288)  # 32/4 = 8 per side
    totals = result['totals']
    assert totals['fastest'] <= min(totals['onednn'], totals['mkl'])
    assert 'the rule costs' in proc.stdout
    # fc1 + GELU at inference, one per stage: oneDNN's fused epilogue against MKL then GELU
    gelu = result['gelu_records']
    assert [r['name'] for r in gelu] == [f'stage{i}.fc1+gelu' for i in range(4)]
    assert result['gelu_totals']['onednn'] > 0 and result['gelu_totals']['mkl'] > 0
    # The window attention forward, each stage's regular and shifted blocks, both kernels
    attention = result['attention_records']
    assert [r['name'] for r in attention] == [f'stage{i}.{kind}' for i in range(4)
                                              for kind in ('regular', 'shifted')]
    assert sum(r['count'] for r in attention) == 2 + 2 + 6 + 2
    assert (attention[0]['windows'], attention[0]['heads'], attention[0]['masked']) == (4, 3, 0)
    assert attention[1]['masked'] == 3  # 8x8 tokens padded to 14x14: the last row and column
    assert result['attention_totals']['flash'] > 0 and result['attention_totals']['explicit'] > 0
    assert "this CPU's rule: flash" in proc.stdout or "this CPU's rule: explicit" in proc.stdout
