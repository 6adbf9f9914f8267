"""OpenAI's two logprobs shapes, built from a request's `meta_info` (`output_token_logprobs`: (logprob, id)
per output token; `output_top_logprobs`: per token a list of (logprob, id), best first).

Chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}`.
Completions: `{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}`.
A token's text is its id decoded alone with special tokens kept; `bytes` are that text's UTF-8 bytes. With
`echo`, completions list the prompt's tokens first (`input_token_logprobs`, the first one's logprob null).
"""

from __future__ import annotations

from collections.abc import Callable

TokenText = Callable[[int], str]


def entries(meta: dict, start: int, stop: int | None = None) -> list[tuple[float, int, list]]:
    """(logprob, id, top [(logprob, id)]) of output tokens [start, stop) from `meta`."""
    tokens = meta.get("output_token_logprobs", [])[start:stop]
    tops = meta.get("output_top_logprobs")
    tops = tops[start:stop] if tops is not None else [[] for _ in tokens]
    return [(lp, tid, top) for (lp, tid), top in zip(tokens, tops, strict=True)]


def prompt_entries(meta: dict) -> list[tuple[float | None, int, list]]:
    """(logprob, id, top) of every prompt token (`input_token_logprobs`; the first one's logprob is None)."""
    pairs = zip(meta["input_token_logprobs"], meta["input_top_logprobs"], strict=True)
    return [(lp, tid, top) for (lp, tid), top in pairs]


def chat_logprobs(items: list[tuple[float, int, list]], text_of: TokenText) -> dict:
    def one(logprob: float, token_id: int) -> dict:
        text = text_of(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {"content": [{**one(lp, tid), "top_logprobs": [one(tlp, t) for tlp, t in top]}
                        for lp, tid, top in items], "refusal": None}


def completion_logprobs(items: list[tuple[float, int, list]], text_of: TokenText, offset: int) -> dict:
    """`offset`: characters of text before the first of these tokens (the echoed prompt, earlier chunks)."""
    tokens, offsets = [], []
    for _, tid, _ in items:
        offsets.append(offset)
        tokens.append(text_of(tid))
        offset += len(tokens[-1])
    return {"tokens": tokens, "token_logprobs": [lp for lp, _, _ in items],
            "top_logprobs": [None if lp is None else _top_by_text(top, text_of) for lp, _, top in items],
            "text_offset": offsets}


def _top_by_text(top: list, text_of: TokenText) -> dict[str, float]:
    """A completions `top_logprobs` entry: {text: logprob} from `top` (best first). Ids that decode to the
    same text share one key, which keeps the most likely one's logprob (the entry's best stays the
    position's best)."""
    out: dict[str, float] = {}
    for logprob, token_id in top:
        out.setdefault(text_of(token_id), logprob)
    return out
