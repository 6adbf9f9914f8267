"""`python -m jaxserve.bench.device` is ready for an accelerator: its correctness and timing paths run here
at tiny sizes (the kernels in interpret mode) and report what they measured."""

import dataclasses

import pytest

from jaxserve.bench import device


def _tiny(layout: device.Layout) -> device.Layout:
    return dataclasses.replace(layout, q_heads=4, kv_heads=2, page_size=16, window=layout.window and 8)


@pytest.mark.slow
def test_device_bench_checks_and_times_each_backend(monkeypatch, capsys):
    cases = device.correctness_cases(small=True)
    step = [device.Seq(20, 5), device.Seq(9, 4, tree=True)]
    monkeypatch.setattr(device, "correctness_cases", lambda small: [(_tiny(cases[0][0]), step)])
    assert device.check(["pallas_tpu", "pallas_gpu"], small=True, interpret=False)
    monkeypatch.setattr(device, "timing_rows", lambda: [("decode 2x40", [device.Seq(39, 1)] * 2)])
    monkeypatch.setattr(device, "copy_bandwidth", lambda: 1e9)
    device.bench(["pallas_gpu", "xla"], _tiny(cases[1][0]), repeats=1, budget_s=60)
    out = capsys.readouterr().out
    assert out.count(" ok") == 2 and "MISMATCH" not in out and "FAILED" not in out
    rows = [line.split() for line in out.splitlines() if line.startswith("decode 2x40")]
    assert [r[2] for r in rows] == ["native", "pallas_gpu", "xla"]
    assert all(float(r[3]) > 0 for r in rows) and float(rows[0][-1]) == 1.0  # ms; native over itself
