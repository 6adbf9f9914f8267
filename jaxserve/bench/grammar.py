"""Cost of constrained decoding: decode tokens/s of a batch with and without a grammar, in one run.

    python -m jaxserve.bench.grammar                 # batch 8, 256 output tokens, 12 repeats
    python -m jaxserve.bench.grammar --batch 16
    python -m jaxserve.bench.grammar --eagle3       # also both batches under EAGLE-3 (the embedded draft)
    python -m jaxserve.bench.grammar --xgrammar     # also the regex batch under the xgrammar backend

Model: the embedded default (its tokenizer builds the grammar's vocabulary). The same `--batch` prompts
decode `--max-new-tokens` tokens (greedy, ignore_eos) unconstrained, then each under the regex
`[a-z ]+` (an open-ended grammar: every step fills and applies a mask), alternating, after one untimed pass
of each (compilation). Every pass, untimed ones too, starts from an empty prefix cache, so the timed passes
run exactly the shapes the untimed ones compiled: the engines' compile counters are read around the timed
passes and a compile there is reported (`compiles_during_timing`). Reported: the median pass's output
tokens/s of each, and each ratio as the median of the per-repeat ratios (the two kinds of one repeat run
back to back, so a load change between repeats cancels; `regex_over_plain` divides two adjacent passes,
and `regex_over_plain_of_medians` divides the medians, for comparison). 256 tokens a pass by default: at
64 a pass is ~0.15 s and the ratios moved by +-8% between runs on a quiet 2-core machine. Under the overlap
schedule a constrained step is cut in two (`engine.split_step`: the forward runs while the host
applies the step before and fills the masks). The run also times both batches with the overlap schedule
off (`plain_sync`, `regex_sync`: each constrained step applied as it is dispatched, the fused step), so
`regex_over_plain_sync` is the mask's own cost and `regex_over_regex_sync` what the split schedule gains.

`--xgrammar` adds the constrained batch on an engine over the same model with `grammar_backend="xgrammar"`
(the optional extra) to the same alternation: `regex_xgrammar_over_plain` is its mask cost, as
`regex_over_plain` is llguidance's, and `regex_xgrammar_over_regex` compares the two libraries.

`--eagle3` adds both batches on an EAGLE-3 engine (its own copy of the target, loaded to capture the
draft's hidden states; the embedded draft; a round every step) to the same
alternation: `eagle3_regex_over_eagle3_plain` is what the grammar costs under speculation (a constrained
round is drafted, read by the host, walked through the grammar, then verified: two calls instead of one),
`eagle3_regex_over_regex` what speculation gives a constrained batch, and the accept lengths (output tokens
per verify round, pooled over the batch, median pass) say how many drafts the grammar walk lets through.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time

from jaxserve.api import Engine
from jaxserve.assets import EMBEDDED_MODEL_DIR
from jaxserve.bench.speculative import engine_compiles

PROMPTS = ["The quick brown fox", "Hello world", "def main():", "Question: what is the capital of France?"]
REGEX = "[a-z ]+"


def _pass(engine: Engine, prompts: list[str], params: dict) -> tuple[float, float | None]:
    """Output tokens per second of one generate call, and its output tokens per verify round (pooled over
    the requests; None without speculation). A constrained call's outputs must match the regex (else
    RuntimeError: a bench that timed unconstrained decoding would report a cost it never measured)."""
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    elapsed = time.perf_counter() - start
    if "regex" in params:
        bad = [o["text"] for o in outs if re.fullmatch(params["regex"], o["text"]) is None]
        if bad:
            raise RuntimeError(f"{len(bad)} constrained outputs do not match {params['regex']!r}: {bad[0]!r}")
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    rounds = sum(o["meta_info"].get("spec_verify_ct", 0) for o in outs)
    return tokens / elapsed, tokens / rounds if rounds else None


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=12, help="timed passes of each kind (ABBA)")
    parser.add_argument("--eagle3", action="store_true", help="also time both batches under EAGLE-3")
    parser.add_argument("--xgrammar", action="store_true",
                        help="also time the constrained batch under the xgrammar backend (an optional extra)")
    args = parser.parse_args(argv)
    flags = dict(page_size=16, max_total_tokens=8192, chunked_prefill_size=64,
                 max_running_requests=max(args.batch, 1), random_seed=0)
    engine = Engine(model_path=str(EMBEDDED_MODEL_DIR), **flags)
    sync = Engine(model=engine.model, tokenizer=engine.tokenizer, disable_overlap_schedule=True, **flags)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.batch)]
    base = {"temperature": 0, "max_new_tokens": args.max_new_tokens, "ignore_eos": True}
    constrained = {**base, "regex": REGEX}
    # each pair a ratio compares runs back to back (plain then regex, then the same without overlap): a
    # load change between two passes a ratio divides is then as unlikely as the machine allows
    kinds = {"plain": (engine, base), "regex": (engine, constrained), "plain_sync": (sync, base),
             "regex_sync": (sync, constrained)}
    if args.xgrammar:
        xgrammar = Engine(model=engine.model, tokenizer=engine.tokenizer, grammar_backend="xgrammar", **flags)
        kinds["regex_xgrammar"] = (xgrammar, constrained)
    if args.eagle3:
        spec = Engine(model_path=str(EMBEDDED_MODEL_DIR), speculative_algorithm="EAGLE3",
                      speculative_draft_model_path=str(EMBEDDED_MODEL_DIR / "draft"), **flags)
        kinds.update({"eagle3_plain": (spec, base), "eagle3_regex": (spec, constrained)})
    for eng, params in kinds.values():  # compile every shape each needs
        eng.flush_cache()
        _pass(eng, prompts, params)
    engines = {eng for eng, _ in kinds.values()}
    compiles_before = sum(map(engine_compiles, engines))
    runs: dict[str, list[tuple[float, float | None]]] = {k: [] for k in kinds}
    order = list(kinds.items())
    for i in range(args.repeats):  # ABBA: every other repeat runs the kinds in reverse order
        for name, (eng, params) in (order if i % 2 == 0 else order[::-1]):
            eng.flush_cache()
            runs[name].append(_pass(eng, prompts, params))
    compiles = sum(map(engine_compiles, engines)) - compiles_before
    median = {k: statistics.median(r for r, _ in v) for k, v in runs.items()}

    def ratio(a: str, b: str) -> float:
        return round(statistics.median(x[0] / y[0] for x, y in zip(runs[a], runs[b], strict=True)), 3)

    result = {"batch": args.batch, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
              "load_avg_1m": round(os.getloadavg()[0], 2), "compiles_during_timing": compiles,
              **{f"{k}_tok_s": round(v, 1) for k, v in median.items()},
              "regex_over_plain": ratio("regex", "plain"),
              "regex_over_plain_of_medians": round(median["regex"] / median["plain"], 3),
              "regex_over_plain_sync": ratio("regex", "plain_sync"),
              "regex_over_regex_sync": ratio("regex", "regex_sync")}
    if args.xgrammar:
        result.update({"regex_xgrammar_over_plain": ratio("regex_xgrammar", "plain"),
                       "regex_xgrammar_over_regex": ratio("regex_xgrammar", "regex")})
    if args.eagle3:
        for name in ("eagle3_plain", "eagle3_regex"):
            result[f"{name}_accept_length"] = round(statistics.median(a for _, a in runs[name]), 3)
        result.update({
            "eagle3_regex_over_eagle3_plain": ratio("eagle3_regex", "eagle3_plain"),
            "eagle3_regex_over_regex": ratio("eagle3_regex", "regex"),
            "eagle3_plain_over_plain": ratio("eagle3_plain", "plain")})
    print(f"grammar bench: batch {args.batch}, {args.max_new_tokens} tokens: plain {median['plain']:.1f}, "
          f"plain without overlap {median['plain_sync']:.1f}, regex {median['regex']:.1f}, "
          f"regex without overlap {median['regex_sync']:.1f} tok/s; "
          f"regex / plain {result['regex_over_plain']:.3f}, "
          f"regex / plain without overlap {result['regex_over_plain_sync']:.3f}; "
          f"{compiles} compilations during the timed passes")
    if args.xgrammar:
        print(f"xgrammar: regex {median['regex_xgrammar']:.1f} tok/s; regex / plain "
              f"{result['regex_xgrammar_over_plain']:.3f}, xgrammar / llguidance "
              f"{result['regex_xgrammar_over_regex']:.3f}")
    if args.eagle3:
        r = result
        print(f"under EAGLE-3: plain {median['eagle3_plain']:.1f} tok/s (accept length "
              f"{r['eagle3_plain_accept_length']}), regex {median['eagle3_regex']:.1f} tok/s (accept length "
              f"{r['eagle3_regex_accept_length']}); regex / plain {r['eagle3_regex_over_eagle3_plain']:.3f}, "
              f"regex with / without EAGLE-3 {r['eagle3_regex_over_regex']:.3f}")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
