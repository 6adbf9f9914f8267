"""`jaxserve.bench.round_host` end to end on the embedded model at a tiny size: both engines run rounds
only, and the figures it derives are consistent with the per-round clocks it reads."""

from __future__ import annotations

import pytest

from jaxserve.bench.round_host import main

pytestmark = pytest.mark.slow  # builds two EAGLE-3 engines


def test_round_host_reports_host_and_device_time_per_round():
    row = main(["--batch-size", "2", "--output-len", "12", "--repeats", "1"])
    assert row["rounds_per_pass"] > 0
    device = row["device_ms_per_round"]
    assert 0 < device < row["sync_wall_ms_per_round"]  # the wall holds the host's part and the device's
    for mode in ("overlap", "sync"):
        assert 0 < row[f"{mode}_host_cpu_ms_per_round"] <= row[f"{mode}_wall_ms_per_round"]
        # the dispatch is part of the host's work per round
        assert 0 < row[f"{mode}_dispatch_cpu_ms_per_round"] <= row[f"{mode}_host_cpu_ms_per_round"]
    assert row["overlap_dispatch_over_host"] == pytest.approx(
        row["overlap_dispatch_cpu_ms_per_round"] / row["overlap_host_cpu_ms_per_round"], rel=1e-2)
    assert row["host_over_device"] == pytest.approx(row["overlap_host_cpu_ms_per_round"] / device, rel=1e-2)
    assert row["overlap_wall_over_device"] == pytest.approx(row["overlap_wall_ms_per_round"] / device,
                                                            rel=1e-2)
