"""The benchmark's roof is timed with the models, and untrustworthy records are flagged."""
import os

import torch

from swin_rpe_plugin.analysis import benchmark


def test_flags_name_a_roofline_above_one_and_a_busy_machine():
    ok = dict(roofline_fraction=0.5, load_avg=1.0)
    assert benchmark.record_flags(ok, threads=2) == []
    assert benchmark.record_flags(dict(ok, roofline_fraction=1.01), 2) == ['roofline>1']
    assert benchmark.record_flags(dict(ok, load_avg=4.7), 2) == ['busy(load 4.7>2)']
    assert benchmark.record_flags(dict(ok, load_avg=2.0), 2) == []  # at, not above


def test_table_shows_the_flags_column():
    records = [dict(arch='tiny', shape=[64, 64], batch=1, mode='infer', ours_ms=1.0,
                    mmdet_ms=2.0, roofline_fraction=1.2, flags=['roofline>1']),
               dict(arch='tiny', shape=[64, 64], batch=1, mode='train', ours_ms=1.0,
                    mmdet_ms=2.0, roofline_fraction=0.4, flags=[])]
    lines = benchmark.format_table(records).splitlines()
    assert lines[0].split(' | ')[-1].strip() == 'flags'
    assert lines[2].split(' | ')[-1].strip() == 'roofline>1'
    assert lines[3].split(' | ')[-1].strip() == '-'


def test_roof_is_timed_in_the_same_rounds_as_the_models(monkeypatch):
    rounds = []

    def fake_timing(fns, x, repeats, warmup=1, progress=None):
        rounds.append(sorted(fns))
        for fn in fns.values():  # each one runs, as the real timing does
            fn(x)
        return {name: 10.0 for name in fns}, {name: [9.0, 10.0, 11.0] for name in fns}

    def tiny_pair(arch, window_size=7, seed=0, **kwargs):
        from swin_rpe_plugin import SwinTransformer
        cfg = dict(embed_dims=8, depths=(1, 1), num_heads=(1, 2), strides=(4, 2),
                   out_indices=(0, 1), window_size=2, drop_path_rate=0.0)
        torch.manual_seed(seed)
        a = SwinTransformer(**cfg)
        b = SwinTransformer(**cfg)
        b.load_state_dict(a.state_dict())
        return a, b

    monkeypatch.setattr(benchmark, 'time_interleaved', fake_timing)
    monkeypatch.setattr(benchmark, 'build_pair', tiny_pair)
    monkeypatch.setattr(benchmark, 'backbone_gflops', lambda model, shape, batch: 1.0)
    monkeypatch.setattr(os, 'getloadavg', lambda: (9.0, 9.0, 9.0))
    record = benchmark.benchmark_case('tiny', (16, 16), 1, 'infer', 1, 2, sgemm=1e6,
                                      measure_memory=False)
    assert rounds == [['mmdet', 'ours', 'roof_mkl', 'roof_onednn']]
    # every function took 10 ms: the roof is 2 n^3 flops in 10 ms, not the sgemm passed in
    roof = 2 * benchmark.ROOF_N ** 3 / 10e-3 / 1e9
    assert abs(record['roof_gflops'] - roof) < 1e-9 * roof
    assert abs(record['roofline_fraction'] - (1.0 / 10e-3) / roof) < 1e-12
    assert record['flags'] == ['busy(load 9.0>2)']
    assert record['ours_spread_ms'] == record['mmdet_spread_ms'] == 2.0
