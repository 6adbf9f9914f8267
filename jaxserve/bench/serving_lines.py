"""The serving stage of `python -m jaxserve.bench.device`: the engine's own targets, measured on the machine.

Each stage runs one benchmark module in this process and turns its figures into target lines:
- `speculative`: `bench.speculative`, policy auto, batches 1, 8, 32 and 64. EAGLE-3 / plain tokens/s per
  batch, as the ratio of the medians and paired (>= 2 at batch 1, >= 1 above); outputs identical; no
  compilation in a timed pass.
- `round_host_served`: `bench.round_host --random-layers 12` (gpt-oss-20b's shapes, random weights; the
  layers are `served_layers`: 12 of the model's 24 fit an 80 GB device while the engine stacks them for
  its scan), batch 32. Host CPU per round over the round's device time (<= 0.25);
  overlapped wall over device (<= 1.1).
- `round_host_embedded`: the same two lines on the embedded checkpoint.
- `grammar`: `bench.grammar`, batch 8. Regex / plain tokens/s under overlap (>= 0.9: the mask costs at
  most 10%).
- `host_cost`: `bench.host_cost`, batch 32. Host time per decode step at 4,096 tokens over at 128, host
  only and in the engine (<= 1.2).

The targets are what the engine promises its users; a line says `met` or `NOT met` for the figure this run
measured (every figure is a ratio of two sides measured in the same run). A stage that raises is reported
with its error and the stages after it still run; a stage that would start past `budget_s` seconds is
skipped and says so (the budget is checked between stages, so a run can end a stage's length past it).
Each stage's lines are printed as it ends, and all of them again at the end.

`Options.tiny`: every stage at tiny sizes (a CPU runs them in a few minutes; for tests: the figures judge
nothing).
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Line:
    """One target line: what was measured, the figure (None: no figure), the target as text, whether the
    figure meets it (None: not judged), and a remark (the stage's error, or why it was skipped)."""

    stage: str
    what: str
    value: float | None
    target: str
    met: bool | None
    remark: str = ""


@dataclasses.dataclass(frozen=True)
class Options:
    """What every stage is given: `tiny` sizes (for tests), and `served_layers`, the layers of
    `round_host_served`'s model (a round's device time grows with them, the host's work does not)."""

    tiny: bool = False
    served_layers: int = 12


def _at_least(stage: str, what: str, value: float, bound: float, remark: str = "") -> Line:
    return Line(stage, what, value, f">= {bound:g}", value >= bound, remark)


def _at_most(stage: str, what: str, value: float, bound: float, remark: str = "") -> Line:
    return Line(stage, what, value, f"<= {bound:g}", value <= bound, remark)


def speculative(options: Options) -> list[Line]:
    from jaxserve.bench import speculative as bench

    argv = (["--batch-sizes", "1", "4", "--output-len", "8", "--repeats", "1"] if options.tiny
            else ["--batch-sizes", "1", "8", "32", "64", "--repeats", "5"])
    lines = []
    for bs, row in bench.main(argv).items():
        bound = 2.0 if bs == 1 else 1.0
        choices = row["policy_choices"]
        what = f"EAGLE-3 / plain tok/s, batch {bs}"
        lines.append(_at_least("speculative", f"{what}, medians", row["speedup"], bound))
        lines.append(_at_least(
            "speculative", f"{what}, paired", row["speedup_paired"], bound,
            f"{choices.get('round_steps', 0)} rounds, {choices.get('plain_decode_steps', 0)} plain steps, "
            f"{choices.get('drafts_dropped', 0)} drafts dropped"))
        lines.append(Line("speculative", f"outputs identical, batch {bs}", None, "yes",
                          bool(row["identical_outputs"])))
        compiles = sum(row["compiles_during_timing"].values())
        lines.append(_at_most("speculative", f"compilations in timed passes, batch {bs}", compiles, 0))
    return lines


def _round_host(stage: str, argv: list[str]) -> list[Line]:
    from jaxserve.bench import round_host

    row = round_host.main(argv)
    remark = (f"{row['model']}: host {row['overlap_host_cpu_ms_per_round']} ms, device "
              f"{row['device_ms_per_round']} ms per round at batch {row['batch_size']}")
    return [_at_most(stage, "host CPU / device per round", row["host_over_device"], 0.25, remark),
            _at_most(stage, "overlapped wall / device per round", row["overlap_wall_over_device"], 1.1)]


def round_host_served(options: Options) -> list[Line]:
    if options.tiny:
        return _round_host("round_host_served", ["--random-layers", "2", "--tiny", "--batch-size", "2",
                                                 "--output-len", "12", "--repeats", "1"])
    return _round_host("round_host_served", ["--random-layers", str(options.served_layers),
                                             "--batch-size", "32", "--repeats", "3"])


def round_host_embedded(options: Options) -> list[Line]:
    return _round_host("round_host_embedded", ["--batch-size", "2", "--output-len", "12", "--repeats", "1"]
                       if options.tiny else ["--batch-size", "32", "--repeats", "5"])


def grammar(options: Options) -> list[Line]:
    from jaxserve.bench import grammar as bench

    row = bench.main(["--batch", "2", "--max-new-tokens", "16", "--repeats", "2"] if options.tiny
                     else ["--batch", "8"])
    what = f"regex / plain tok/s, batch {row['batch']}, overlap"
    return [_at_least("grammar", what, row["regex_over_plain"], 0.9,
                      f"ratio of medians {row['regex_over_plain_of_medians']}, without overlap "
                      f"{row['regex_over_plain_sync']} (regex / plain)")]


def host_cost(options: Options) -> list[Line]:
    from jaxserve.bench import host_cost as bench

    argv = (["--batch-size", "2", "--contexts", "16", "64", "--steps", "4", "--repeats", "1"] if options.tiny
            else ["--batch-size", "32"])
    row = bench.main(argv)
    short, long = sorted(row["host_only_paired_ratio"])  # contexts in tokens
    what = f"host per decode step, {long} / {short} tokens"
    return [_at_most("host_cost", f"{what}, host only", row["host_only_paired_ratio"][long], 1.2,
                     f"paired; fastest passes {row['host_only_ratio_to_shortest'][long]}"),
            _at_most("host_cost", f"{what}, engine CPU", row["engine_host_cpu_ratio_to_shortest"][long], 1.2)]


STAGES: dict[str, Callable[[Options], list[Line]]] = {  # in the order `run` runs them by default
    "speculative": speculative, "round_host_served": round_host_served,
    "round_host_embedded": round_host_embedded, "grammar": grammar, "host_cost": host_cost}


def run(options: Options = Options(), *, budget_s: float = 360.0, stages: tuple[str, ...] = tuple(STAGES)
        ) -> list[Line]:
    """Run `stages` in order within `budget_s` seconds (see the module docstring); every stage's lines.
    Raises ValueError (before running any) for a name not in `STAGES`."""
    unknown = [name for name in stages if name not in STAGES]
    if unknown:
        raise ValueError(f"unknown serving stages {unknown}; known: {list(STAGES)}")
    started, lines = time.perf_counter(), []
    for name in stages:
        elapsed = time.perf_counter() - started
        if elapsed > budget_s:
            remark = f"skipped: {elapsed:.0f} s of {budget_s:.0f} used"
            lines.append(Line(name, "(stage)", None, "", None, remark))
            continue
        print(f"\n== serving stage {name} ({elapsed:.0f} s in)", flush=True)
        gc.collect()  # the engines of the stage before: their device buffers go before this one's are made
        try:
            done = STAGES[name](options)
        except Exception as exc:  # reported in the summary; the next stages still run
            done = [Line(name, "(stage)", None, "", None, f"FAILED {type(exc).__name__}: {exc}")]
        print(summary(done), flush=True)  # now: a run killed at its time limit still shows what it measured
        lines += done
    return lines


def summary(lines: list[Line]) -> str:
    """The lines as one table: stage, what, figure, target, met / NOT met / -, remark."""
    rows = [f"{'stage':<27} {'what':<50} {'figure':>8} {'target':>7}  result"]
    for ln in lines:
        value = "" if ln.value is None else f"{ln.value:.3f}" if isinstance(ln.value, float) else ln.value
        result = "-" if ln.met is None else "met" if ln.met else "NOT met"
        remark = f"  ({ln.remark})" if ln.remark else ""
        rows.append(f"{ln.stage:<27} {ln.what:<50} {value!s:>8} {ln.target:>7}  {result}{remark}")
    return "\n".join(rows)
