"""`python -m jaxserve.bench.device --stages kernels` is ready for an accelerator: `--tiny` runs its three
stages here at tiny sizes: correctness against native and `bench.attention`'s timing table with a kernel
in interpret mode, the end-to-end EAGLE-3 decode of a random gpt-oss on `xla` (each kernel's engine runs are
test_pallas_end_to_end's: compiling them again here would double the cost), then the summary table."""

import dataclasses
import re

import pytest

from jaxserve.bench import attention, device, gpt_oss_e2e


def _tiny(layout: attention.Layout) -> attention.Layout:
    return dataclasses.replace(layout, q_heads=4, kv_heads=2, page_size=16, window=layout.window and 8)


@pytest.mark.slow
def test_device_bench_tiny_runs_every_stage_and_summarises(monkeypatch, capsys):
    cases = device.correctness_cases(small=True)
    step = [attention.Seq(20, 5), attention.Seq(9, 4, tree=True)]
    monkeypatch.setattr(device, "correctness_cases", lambda small: [(_tiny(cases[0][0]), step)])
    monkeypatch.setattr(device, "QUICK", attention.Sizes(batches=(2,), contexts=(40,), chunk=8))
    monkeypatch.setattr(gpt_oss_e2e, "TINY_SIZES", dict(batch=1, prompt_len=24, new_tokens=3, chunk=16))
    device.main(["--tiny", "--stages", "kernels", "--kernels", "pallas_gpu", "--e2e-backends", "xla",
                 "--repeats", "1", "--layers", "3"])
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert sum(ln.endswith("  ok") for ln in lines) == 2 and "MISMATCH" not in out and "FAILED" not in out
    for label in ("decode 2x40", "mixed 2x40"):  # native timed first: the others' rows divide by it
        rows = [ln.split() for ln in lines if ln.startswith(label)]
        assert [r[2] for r in rows] == ["native", "xla", "pallas_gpu"]
        assert all(float(r[3]) > 0 for r in rows) and float(rows[0][-1]) == 1.0  # ms; native over itself
    e2e = [ln.split() for ln in lines if re.match(r"(native|xla) +[\d.]+ +[\d.]+ ", ln)]
    assert [(r[0], r[-1]) for r in e2e] == [("native", "equal"), ("xla", "equal")]
    assert re.search(r"correctness +all +all ok", out)
    assert re.search(r"attention +pallas_gpu +decode 2x40: [\d.]+ of copy bandwidth, [\d.]+x native", out)
    assert re.search(r"end-to-end +xla +[\d.]+ tokens/s, [\d.]+x native, tokens equal", out)
