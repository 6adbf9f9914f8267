"""Synthetic request sets for `jaxserve.bench_serving`, generated locally from a seed (no downloads).

`random`: prompts of uniform random token ids, input/output lengths drawn from
[len * range_ratio, len] (SGLang's `--random-range-ratio`). `generated-shared-prefix`: `num_groups`
system prompts of `system_prompt_len` tokens, each followed by `prompts_per_group` different questions of
`question_len` tokens (a prefix-cache workload). As text (`as_text`), each token becomes one word drawn from
a fixed list, so lengths are approximate in the server's tokenizer.
"""

from __future__ import annotations

import dataclasses

import numpy as np

_WORDS = ("time", "person", "year", "way", "day", "thing", "world", "life", "hand", "part", "child", "eye",
          "place", "work", "week", "case", "point", "number", "group", "problem", "fact", "water", "story")
FIRST_TOKEN_ID = 10  # skip the lowest ids, where tokenizers keep their special tokens


@dataclasses.dataclass(frozen=True)
class BenchRequest:
    """One request: `prompt` (token ids or text), its length in tokens (as generated), tokens to generate."""

    prompt: list[int] | str
    prompt_len: int
    output_len: int


def _lengths(rng: np.random.RandomState, length: int, range_ratio: float, num: int) -> np.ndarray:
    low = max(1, int(length * range_ratio))
    return rng.randint(low, length + 1, size=num)


def _tokens(rng: np.random.RandomState, num_tokens: int, vocab_size: int) -> list[int]:
    return rng.randint(FIRST_TOKEN_ID, vocab_size, size=num_tokens).tolist()


def _as_prompt(ids: list[int], as_text: bool) -> list[int] | str:
    return " ".join(_WORDS[i % len(_WORDS)] for i in ids) if as_text else ids


def random_requests(num_prompts: int, *, input_len: int, output_len: int, range_ratio: float,
                    vocab_size: int, seed: int = 0, as_text: bool = False) -> list[BenchRequest]:
    rng = np.random.RandomState(seed)
    inputs = _lengths(rng, input_len, range_ratio, num_prompts)
    outputs = _lengths(rng, output_len, range_ratio, num_prompts)
    return [BenchRequest(_as_prompt(_tokens(rng, int(n), vocab_size), as_text), int(n), int(m))
            for n, m in zip(inputs, outputs, strict=True)]


def shared_prefix_requests(*, num_groups: int, prompts_per_group: int, system_prompt_len: int,
                           question_len: int, output_len: int, vocab_size: int, seed: int = 0,
                           as_text: bool = False) -> list[BenchRequest]:
    """Groups interleaved (group 0 question 0, group 1 question 0, ...) so prefixes are reused across time."""
    rng = np.random.RandomState(seed)
    systems = [_tokens(rng, system_prompt_len, vocab_size) for _ in range(num_groups)]
    out = []
    for _ in range(prompts_per_group):
        for system in systems:
            ids = system + _tokens(rng, question_len, vocab_size)
            out.append(BenchRequest(_as_prompt(ids, as_text), len(ids), output_len))
    return out
