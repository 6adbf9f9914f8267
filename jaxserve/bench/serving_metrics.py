"""Per-request measurements of `jaxserve.bench_serving` and their summary (percentiles, throughput), plus
the PNG plot (matplotlib, Agg backend).

Units: seconds for latencies (reported in ms in the summary), tokens/s for throughput. TTFT: request sent
-> first token received. ITL: gaps between successive streamed chunks. TPOT: (E2E - TTFT) / (output - 1).
"""

from __future__ import annotations

import dataclasses

import numpy as np

PERCENTILES = (50, 90, 99)


@dataclasses.dataclass
class RequestResult:
    success: bool = False
    prompt_len: int = 0
    output_len: int = 0
    cached_tokens: int = 0
    start_s: float = 0.0  # since the benchmark started
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    itls_s: list[float] = dataclasses.field(default_factory=list)
    error: str = ""


def _stats(name: str, values_s: list[float]) -> dict[str, float]:
    arr = np.asarray(values_s or [0.0]) * 1000
    out = {f"mean_{name}_ms": float(arr.mean()), f"median_{name}_ms": float(np.median(arr))}
    out.update({f"p{p}_{name}_ms": float(np.percentile(arr, p)) for p in PERCENTILES})
    return out


def summarize(results: list[RequestResult], duration_s: float) -> dict[str, float | int]:
    """Totals, throughputs and latency percentiles over the successful requests."""
    ok = [r for r in results if r.success]
    input_tokens = sum(r.prompt_len for r in ok)
    output_tokens = sum(r.output_len for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    tpots = [(r.e2e_s - r.ttft_s) / (r.output_len - 1) for r in ok if r.output_len > 1]
    return {
        "completed": len(ok), "failed": len(results) - len(ok), "duration_s": duration_s,
        "total_input_tokens": input_tokens, "total_output_tokens": output_tokens, "cached_tokens": cached,
        "cache_hit_rate": cached / input_tokens if input_tokens else 0.0,
        "request_throughput": len(ok) / duration_s, "input_throughput": input_tokens / duration_s,
        "output_throughput": output_tokens / duration_s,
        **_stats("ttft", [r.ttft_s for r in ok]), **_stats("itl", [x for r in ok for x in r.itls_s]),
        **_stats("tpot", tpots), **_stats("e2e_latency", [r.e2e_s for r in ok]),
    }


def format_summary(summary: dict) -> str:
    lines = ["{:=^60}".format(" Serving Benchmark Result ")]
    for key, value in summary.items():
        lines.append(f"{key:<44}{value:>16.2f}" if isinstance(value, float) else f"{key:<44}{value:>16}")
    lines.append("=" * 60)
    return "\n".join(lines)


def plot(results: list[RequestResult], path: str, title: str) -> None:
    """Four panels: TTFT and E2E latency histograms, ITL histogram, completed tokens over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if r.success]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    panels = [(axes[0, 0], [r.ttft_s * 1000 for r in ok], "TTFT (ms)"),
              (axes[0, 1], [r.e2e_s * 1000 for r in ok], "E2E latency (ms)"),
              (axes[1, 0], [x * 1000 for r in ok for x in r.itls_s], "ITL (ms)")]
    for ax, values, label in panels:
        ax.hist(values or [0], bins=30, color="tab:blue")
        ax.set_xlabel(label)
        ax.set_ylabel("count")
    ends = sorted((r.start_s + r.e2e_s, r.output_len) for r in ok)
    axes[1, 1].step([t for t, _ in ends], np.cumsum([n for _, n in ends]), where="post")
    axes[1, 1].set_xlabel("time since start (s)")
    axes[1, 1].set_ylabel("output tokens completed")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
