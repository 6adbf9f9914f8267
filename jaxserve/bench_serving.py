"""`python -m jaxserve.bench_serving`: load a running server with synthetic requests and report TTFT, ITL,
TPOT, E2E latency percentiles and throughput (SGLang's bench_serving flags for what is supported).

    python -m jaxserve.bench_serving --port 30000 --dataset-name random --num-prompts 200 \
        --random-input-len 256 --random-output-len 64 --request-rate 8 --max-concurrency 32 \
        --output-file bench.json            # also writes bench.png (or --plot-file)

Requests go to /generate with `stream: true` (TTFT and ITL are measured per streamed chunk), greedy and
`ignore_eos` so each generates exactly its output length. Arrivals are Poisson at `--request-rate` per
second (inf: all at once), at most `--max-concurrency` in flight. Datasets: `jaxserve.bench.serving_data`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import numpy as np

from jaxserve.bench.serving_data import BenchRequest, random_requests, shared_prefix_requests
from jaxserve.bench.serving_metrics import RequestResult, format_summary, plot, summarize


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jaxserve.bench_serving", allow_abbrev=False)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--base-url", default=None, help="overrides --host/--port, e.g. http://10.0.0.2:30000")
    p.add_argument("--api-key", default=None)
    p.add_argument("--dataset-name", choices=("random", "generated-shared-prefix"), default="random")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--random-input-len", type=int, default=256)
    p.add_argument("--random-output-len", type=int, default=64)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--gsp-num-groups", type=int, default=8)
    p.add_argument("--gsp-prompts-per-group", type=int, default=8)
    p.add_argument("--gsp-system-prompt-len", type=int, default=512)
    p.add_argument("--gsp-question-len", type=int, default=64)
    p.add_argument("--gsp-output-len", type=int, default=64)
    p.add_argument("--prompt-format", choices=("ids", "text"), default="ids",
                   help="send token ids (exact lengths) or words (lengths approximate)")
    p.add_argument("--request-rate", type=float, default=float("inf"))
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--output-file", default=None, help="JSON summary (+ per-request results)")
    p.add_argument("--plot-file", default=None, help="PNG (default: --output-file with .png)")
    return p


def make_requests(args: argparse.Namespace, vocab_size: int) -> list[BenchRequest]:
    as_text = args.prompt_format == "text"
    if args.dataset_name == "random":
        return random_requests(args.num_prompts, input_len=args.random_input_len,
                               output_len=args.random_output_len, range_ratio=args.random_range_ratio,
                               vocab_size=vocab_size, seed=args.seed, as_text=as_text)
    return shared_prefix_requests(num_groups=args.gsp_num_groups,
                                  prompts_per_group=args.gsp_prompts_per_group,
                                  system_prompt_len=args.gsp_system_prompt_len,
                                  question_len=args.gsp_question_len, output_len=args.gsp_output_len,
                                  vocab_size=vocab_size, seed=args.seed, as_text=as_text)


async def send(client: httpx.AsyncClient, req: BenchRequest, t0: float) -> RequestResult:
    """One streamed /generate; failures are recorded in the result, never raised."""
    key = "text" if isinstance(req.prompt, str) else "input_ids"
    body = {key: req.prompt, "stream": True, "sampling_params": {
        "temperature": 0, "max_new_tokens": req.output_len, "ignore_eos": True}}
    result = RequestResult(prompt_len=req.prompt_len)
    start = time.perf_counter()
    result.start_s = start - t0
    last = start
    try:
        async with client.stream("POST", "/generate", json=body) as r:
            if r.status_code != 200:
                result.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')}"
                return result
            meta = None
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                now = time.perf_counter()
                if meta is None:
                    result.ttft_s = now - start
                else:
                    result.itls_s.append(now - last)
                last = now
                meta = json.loads(line[6:])["meta_info"]
        result.e2e_s = time.perf_counter() - start
        result.output_len, result.cached_tokens = meta["completion_tokens"], meta["cached_tokens"]
        result.prompt_len = meta["prompt_tokens"]
        result.success = True
    except (httpx.HTTPError, json.JSONDecodeError, KeyError, TypeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def run(args: argparse.Namespace, base_url: str) -> tuple[list[RequestResult], float, dict]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=None,
                                 limits=httpx.Limits(max_connections=None)) as client:
        info = (await client.get("/get_server_info")).raise_for_status().json()
        requests = make_requests(args, int(info["vocab_size"]))
        rng = np.random.RandomState(args.seed)
        gate = asyncio.Semaphore(args.max_concurrency or len(requests))

        async def limited(req: BenchRequest, t0: float) -> RequestResult:
            async with gate:
                return await send(client, req, t0)

        t0 = time.perf_counter()
        tasks = []
        for req in requests:
            tasks.append(asyncio.create_task(limited(req, t0)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.exponential(1.0 / args.request_rate))
        results = list(await asyncio.gather(*tasks))
        return results, time.perf_counter() - t0, info


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    base_url = args.base_url or f"http://{args.host}:{args.port}"
    try:
        results, duration_s, info = asyncio.run(run(args, base_url))
    except httpx.HTTPError as exc:
        print(f"error: cannot benchmark {base_url}: {exc}", file=sys.stderr)
        return 1
    summary = summarize(results, duration_s)
    print(format_summary(summary))
    for r in [r for r in results if not r.success][:3]:
        print(f"failed request: {r.error}", file=sys.stderr)
    if args.output_file:
        record = {"args": vars(args), "server": {k: info.get(k) for k in ("model_path", "page_size",
                                                                           "max_total_tokens")},
                  "summary": summary, "requests": [r.__dict__ for r in results]}
        Path(args.output_file).write_text(json.dumps(record, indent=1, default=str))
    plot_file = args.plot_file
    if plot_file is None and args.output_file:
        plot_file = str(Path(args.output_file).with_suffix(".png"))
    if plot_file:
        plot(results, plot_file, f"{args.dataset_name}, {len(results)} requests, rate {args.request_rate}")
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
