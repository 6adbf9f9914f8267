"""`python -m jaxserve.bench.device` is ready for an accelerator: its correctness path and its timing stage
(`bench.attention`'s table) run here at tiny sizes (the kernels in interpret mode) and report what they
measured."""

import dataclasses

import pytest

from jaxserve.bench import attention, device


def _tiny(layout: attention.Layout) -> attention.Layout:
    return dataclasses.replace(layout, q_heads=4, kv_heads=2, page_size=16, window=layout.window and 8)


@pytest.mark.slow
def test_device_bench_checks_and_times_each_backend(monkeypatch, capsys):
    cases = device.correctness_cases(small=True)
    step = [attention.Seq(20, 5), attention.Seq(9, 4, tree=True)]
    monkeypatch.setattr(device, "correctness_cases", lambda small: [(_tiny(cases[0][0]), step)])
    assert device.check(["pallas_tpu", "pallas_gpu"], small=True, interpret=False)
    sizes = attention.Sizes(batches=(2,), contexts=(40,), chunk=8)
    layout = _tiny(attention.llama_layout("gpu"))
    attention.bench(["pallas_gpu", "xla", "native"], layout, sizes=sizes, repeats=1, bandwidth=1e9,
                    interpret=True)
    out = capsys.readouterr().out
    assert out.count(" ok") == 2 and "MISMATCH" not in out and "FAILED" not in out
    for label in ("decode 2x40", "mixed 2x40"):  # native timed first: the others' rows divide by it
        rows = [line.split() for line in out.splitlines() if line.startswith(label)]
        assert [r[2] for r in rows] == ["native", "pallas_gpu", "xla"]
        assert all(float(r[3]) > 0 for r in rows) and float(rows[0][-1]) == 1.0  # ms; native over itself
