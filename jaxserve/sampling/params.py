"""`SamplingParams`: one request's sampling and stopping settings, with SGLang's names and defaults.

Host-side only (no JAX). Every instance is valid on construction except for checks that need the model's
vocabulary (`validate(vocab_size)`). `stop` and `stop_token_ids` are normalised to tuples so that the
dataclass stays hashable and immutable.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from jaxserve.sampling.errors import InvalidSamplingParamsError

# what a request's grammar can be: SGLang's three sampling params, and Lark (llguidance's own format, which
# llguidance compiles whatever the grammar backend: `tool_choice` enforcement is written in it)
GRAMMAR_KINDS = ("json_schema", "regex", "ebnf", "lark")

# SGLang treats temperatures below this as greedy decoding; so do we (see `is_greedy`).
GREEDY_TEMPERATURE_EPS = 1e-5
# Most entries of one request's logit_bias, and most top logprobs per token (OpenAI's limit): both are
# fixed widths of the device step's arrays, so that no request changes a shape.
MAX_LOGIT_BIAS = 64
MAX_TOP_LOGPROBS = 20
_INT32_MAX = 2**31 - 1

# SGLang parameters that jaxserve recognises but does not implement yet: named separately in errors so a
# user knows the key is not a typo.
_UNSUPPORTED_SGLANG_KEYS = frozenset(
    {
        "min_new_tokens",
        "structural_tag",
        "no_stop_trim",
        "spaces_between_special_tokens",
        "custom_params",
        "stream_interval",
    }
)


def _fail(name: str, value: Any, expected: str) -> InvalidSamplingParamsError:
    return InvalidSamplingParamsError(f"sampling parameter {name}={value!r} is invalid: expected {expected}")


def _check_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(name, value, f"an int, got {type(value).__name__}")


def _check_float(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(name, value, f"a number, got {type(value).__name__}")
    if math.isnan(value):
        raise _fail(name, value, "a number, got NaN")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise _fail(name, value, f"true or false, got {type(value).__name__}")


def _normalise_stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    strings = (value,) if isinstance(value, str) else value
    if not isinstance(strings, Sequence) or not all(isinstance(s, str) for s in strings):
        raise _fail("stop", value, "a string, a list of strings, or null")
    if any(s == "" for s in strings):
        raise _fail("stop", value, "non-empty strings (an empty stop string would match immediately)")
    return tuple(strings)


def _normalise_logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """{token id (int or decimal string, as JSON keys are): bias in [-100, 100]} -> sorted (id, bias)."""
    if value is None:
        return ()
    if isinstance(value, tuple):
        value = dict(value)
    if not isinstance(value, Mapping):
        raise _fail("logit_bias", value, "an object mapping token ids to numbers")
    if len(value) > MAX_LOGIT_BIAS:
        raise _fail("logit_bias", f"<{len(value)} entries>", f"at most {MAX_LOGIT_BIAS} entries")
    pairs = {}
    for key, bias in value.items():
        token_id = key if isinstance(key, int) and not isinstance(key, bool) else \
            int(key) if isinstance(key, str) and key.strip().isdigit() else None
        if token_id is None or token_id < 0:
            raise _fail("logit_bias", value, f"non-negative token ids as keys, got {key!r}")
        _check_float(f"logit_bias[{key!r}]", bias)
        if not -100.0 <= bias <= 100.0:
            raise _fail(f"logit_bias[{key!r}]", bias, "a number in [-100, 100]")
        pairs[token_id] = float(bias)
    return tuple(sorted(pairs.items()))


def _normalise_token_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise _fail("stop_token_ids", value, "a list of ints or null")
    for token_id in value:
        if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
            raise _fail("stop_token_ids", value, "non-negative int token ids")
    return tuple(value)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample and when to stop, per request (SGLang's `sampling_params` names and defaults).

    temperature: 0 (or below 1e-5) means greedy argmax. top_k: -1 disables; values above the vocabulary
    size act as disabled. top_p: in (0, 1], 1 disables. min_p: in [0, 1], 0 disables.
    repetition_penalty: > 0, 1 disables; applies to tokens seen in prompt or output.
    frequency_penalty / presence_penalty: in [-2, 2], 0 disables; apply to output tokens only.
    seed: makes the request's samples reproducible whatever batch it runs in. n must be 1 (parallel
    sampling forks requests above this level).
    logit_bias: {token id: bias in [-100, 100]} added to the logits before penalties (at most 64 entries).
    return_logprob: record each output token's log-probability; top_logprobs_num (0..20): also the most
    likely tokens at each step. Both are of the model's raw distribution (see `SampleOutput`).
    prompt_logprobs: also each prompt token's logprob given the tokens before it (and its top ones); the
    prompt is then computed whole (no prefix-cache reuse at first admission).
    json_schema / regex / ebnf / lark: constrain the output to a grammar (at most one; see `grammar`). `lark`
    is llguidance's Lark format, compiled by llguidance whatever the grammar backend.
    """

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: tuple[str, ...] | str | Sequence[str] | None = None
    stop_token_ids: tuple[int, ...] | Sequence[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    return_logprob: bool = False
    top_logprobs_num: int = 0
    prompt_logprobs: bool = False
    n: int = 1
    skip_special_tokens: bool = True
    logit_bias: tuple[tuple[int, float], ...] | Mapping[str, float] | None = None
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    lark: str | None = None

    def __post_init__(self) -> None:
        _check_int("max_new_tokens", self.max_new_tokens)
        if self.max_new_tokens < 0:
            raise _fail("max_new_tokens", self.max_new_tokens, "an int >= 0")
        _check_float("temperature", self.temperature)
        if not 0.0 <= self.temperature < math.inf:
            raise _fail("temperature", self.temperature, "a finite number >= 0 (0 means greedy)")
        _check_float("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise _fail("top_p", self.top_p, "a number in (0, 1] (1 disables top-p)")
        _check_int("top_k", self.top_k)
        if self.top_k == 0 or self.top_k < -1:
            raise _fail("top_k", self.top_k, "-1 (disabled) or an int >= 1")
        _check_float("min_p", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise _fail("min_p", self.min_p, "a number in [0, 1] (0 disables min-p)")
        _check_float("repetition_penalty", self.repetition_penalty)
        if not 0.0 < self.repetition_penalty < math.inf:
            raise _fail("repetition_penalty", self.repetition_penalty, "a finite number > 0 (1 disables it)")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            _check_float(name, value)
            if not -2.0 <= value <= 2.0:
                raise _fail(name, value, "a number in [-2, 2] (0 disables it)")
        object.__setattr__(self, "stop", _normalise_stop(self.stop))
        object.__setattr__(self, "stop_token_ids", _normalise_token_ids(self.stop_token_ids))
        if self.seed is not None:
            _check_int("seed", self.seed)
        _check_int("n", self.n)
        if self.n != 1:
            raise _fail("n", self.n, "1 (parallel sampling is not supported; send n separate requests)")
        for name in ("ignore_eos", "return_logprob", "prompt_logprobs", "skip_special_tokens"):
            _check_bool(name, getattr(self, name))
        _check_int("top_logprobs_num", self.top_logprobs_num)
        if not 0 <= self.top_logprobs_num <= MAX_TOP_LOGPROBS:
            raise _fail("top_logprobs_num", self.top_logprobs_num, f"an int in [0, {MAX_TOP_LOGPROBS}]")
        object.__setattr__(self, "logit_bias", _normalise_logit_bias(self.logit_bias))
        grammars = [name for name in GRAMMAR_KINDS if getattr(self, name) is not None]
        for name in grammars:
            if not isinstance(getattr(self, name), str):
                raise _fail(name, getattr(self, name), "a string")
        if len(grammars) > 1:
            raise _fail(" / ".join(grammars), "...", f"at most one of {', '.join(GRAMMAR_KINDS)}")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> SamplingParams:
        """Build from a JSON-style dict (SGLang's `sampling_params`); None or {} gives the defaults.

        Raises InvalidSamplingParamsError naming every unknown key, or the first invalid value.
        """
        if values is None:
            return cls()
        if not isinstance(values, Mapping):
            raise InvalidSamplingParamsError(
                f"sampling_params must be an object/dict, got {type(values).__name__}"
            )
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(str(key) for key in values if key not in known)
        if unknown:
            unsupported = [key for key in unknown if key in _UNSUPPORTED_SGLANG_KEYS]
            hint = ""
            if unsupported:
                hint = f" ({', '.join(unsupported)}: SGLang parameters jaxserve does not support yet)"
            raise InvalidSamplingParamsError(
                f"unknown sampling parameter(s) {', '.join(unknown)}{hint}; "
                f"supported: {', '.join(sorted(known))}"
            )
        return cls(**values)

    def validate(self, vocab_size: int) -> SamplingParams:
        """Vocabulary checks: every stop token id and logit_bias key must be in [0, vocab_size). Returns
        self."""
        outside = [token_id for token_id in self.stop_token_ids if token_id >= vocab_size]
        if outside:
            raise _fail(
                "stop_token_ids",
                list(self.stop_token_ids),
                f"ids below the vocabulary size {vocab_size} (out of range: {outside})",
            )
        outside = [token_id for token_id, _ in self.logit_bias if token_id >= vocab_size]
        if outside:
            raise _fail("logit_bias", dict(self.logit_bias),
                        f"token ids below the vocabulary size {vocab_size} (out of range: {outside})")
        return self

    @property
    def grammar(self) -> tuple[str, str] | None:
        """(kind, source) of the output constraint - a kind of GRAMMAR_KINDS - or None."""
        for kind in GRAMMAR_KINDS:
            if getattr(self, kind) is not None:
                return kind, getattr(self, kind)
        return None

    @property
    def is_greedy(self) -> bool:
        """True when the request decodes greedily (temperature below 1e-5, as in SGLang)."""
        return self.temperature < GREEDY_TEMPERATURE_EPS

    @property
    def uses_penalties(self) -> bool:
        """True when any of the three penalties is active (the engine then needs a `PenaltyPool`)."""
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    @functools.cached_property
    def sampler_values(self) -> tuple[float, int, float, float, float, float, float, int]:
        """What a sampling batch row takes from these params, computed once per params object (a step
        reads it for every sampling row): (temperature, top_k, top_p, min_p, repetition_penalty,
        frequency_penalty, presence_penalty, top_logprobs_num). A greedy row carries temperature 0 and
        its three filters off (top_k -1, top_p 1, min_p 0): the argmax survives every filter, so an
        all-greedy batch skips the filter search on device. top_k is capped at the int32 maximum."""
        if self.is_greedy:
            temperature, top_k, top_p, min_p = 0.0, -1, 1.0, 0.0
        else:
            temperature, top_k = self.temperature, min(self.top_k, _INT32_MAX)
            top_p, min_p = self.top_p, self.min_p
        return (temperature, top_k, top_p, min_p, self.repetition_penalty, self.frequency_penalty,
                self.presence_penalty, self.top_logprobs_num)
