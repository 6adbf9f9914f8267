"""`python -m jaxserve.test.send_one [--prompt TEXT] [--max-new-tokens N] [--port 30000] [--stream]`.

Sends one `/generate` request (the raw prompt, no chat template; temperature 0 by default) and prints the
text, then the two lines SGLang's `send_one` prints (`acc_length=1.33`, `speed=217.98 token/s`; what people
grep for), then a table of latency, completion tokens, acceptance length and speed: acc_length =
completion_tokens / spec_verify_ct when spec_verify_ct > 0, else 1.0; speed = completion_tokens /
e2e_latency (both from the response's meta_info).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence

DEFAULT_PROMPT = "Human: Give me a fully functional FastAPI server. Show the python code.\n\nAssistant:"
STOP = ["Question", "Assistant:", "<|separator|>", "<|eos|>"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jaxserve.test.send_one", allow_abbrev=False)
    p.add_argument("--host", default="localhost")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--different-prompts", action="store_true", help='prefix item i with "Test case i: "')
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--return-logprob", action="store_true")
    p.add_argument("--stream", action="store_true")
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer <key>'")
    return p


def acc_length_and_speed(meta_info: dict) -> tuple[float, float]:
    """(acceptance length, tokens per second) from a /generate meta_info."""
    tokens = meta_info["completion_tokens"]
    verify_ct = meta_info.get("spec_verify_ct", 0)
    acc_length = tokens / verify_ct if verify_ct > 0 else 1.0
    latency = meta_info["e2e_latency"]
    return acc_length, tokens / latency if latency > 0 else 0.0


def format_table(latency_s: float, tokens: int, acc_length: float, speed: float) -> str:
    cells = [f"{latency_s:.3f}", str(tokens), f"{acc_length:.3f}", f"{speed:.2f}"]
    heads = ["Latency (s)", "Tokens", "Acc Length", "Speed (token/s)"]
    widths = [max(len(h), len(c)) + 2 for h, c in zip(heads, cells, strict=True)]
    rule = "+" + "+".join("-" * w for w in widths) + "+"
    row = lambda items: "|" + "|".join(x.center(w) for x, w in zip(items, widths, strict=True)) + "|"
    return "\n".join([rule, row(heads), rule, row(cells), rule])


def _request(url: str, payload: dict, api_key: str | None) -> urllib.request.Request:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return urllib.request.Request(url, data=json.dumps(payload).encode(), headers=headers)


def send_one(args: argparse.Namespace) -> tuple[float, float]:
    """Send the request and print as described above; returns (acc_length, speed), (0, 0) on an error."""
    text: str | list[str] = args.prompt
    if args.batch_size > 1:
        text = [f"Test case {i}: {args.prompt}" if args.different_prompts else args.prompt
                for i in range(args.batch_size)]
    payload = {"text": text, "stream": args.stream, "return_logprob": args.return_logprob,
               "sampling_params": {"temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
                                   "frequency_penalty": args.frequency_penalty,
                                   "presence_penalty": args.presence_penalty, "stop": STOP}}
    url = f"http://{args.host}:{args.port}/generate"
    try:
        with urllib.request.urlopen(_request(url, payload, args.api_key)) as response:
            ret = _read_stream(response) if args.stream else json.loads(response.read())
    except urllib.error.HTTPError as exc:
        print(f"Error: HTTP {exc.code}: {exc.read().decode(errors='replace')}")
        return 0.0, 0.0
    if isinstance(ret, list):
        ret = ret[0]
    if not args.stream:
        print(ret["text"])
    meta = ret["meta_info"]
    acc_length, speed = acc_length_and_speed(meta)
    print(f"acc_length={acc_length:.2f}")
    print(f"speed={speed:.2f} token/s")
    print(format_table(meta["e2e_latency"], meta["completion_tokens"], acc_length, speed))
    return acc_length, speed


def _read_stream(response) -> dict:
    last, printed = None, ""
    for raw in response:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            break
        last = json.loads(data)
        print(last["text"][len(printed):], end="", flush=True)
        printed = last["text"]
    print()
    if last is None:
        raise RuntimeError("the stream ended without any chunk")
    return last


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        acc_length, _ = send_one(args)
    except urllib.error.URLError as exc:
        print(f"Error: cannot reach http://{args.host}:{args.port}: {exc.reason}", file=sys.stderr)
        return 1
    return 0 if acc_length > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
