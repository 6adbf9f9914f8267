"""Validation and normalisation of `generate` arguments (SGLang's shapes: one prompt or a list, one
sampling_params dict or a list) into per-request token ids and `SamplingParams`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxserve.engine.errors import InvalidRequestError, PromptTooLongError, RequestTooLargeError
from jaxserve.engine.kv_cache import KVCache
from jaxserve.sampling import SamplingParams

Prompt = str | Sequence[str] | None
InputIds = Sequence[int] | Sequence[Sequence[int]] | np.ndarray | None
ParamsArg = SamplingParams | Mapping[str, Any] | Sequence[SamplingParams | Mapping[str, Any]] | None


def _is_batch_of_ids(input_ids: Any) -> bool:
    if isinstance(input_ids, np.ndarray):
        return input_ids.ndim == 2
    return len(input_ids) > 0 and not isinstance(input_ids[0], int | np.integer)


def normalise_prompts(prompt: Prompt, input_ids: InputIds) -> tuple[list[str | list[int]], bool]:
    """Return (items, is_batch): each item is a text prompt or a list of token ids. Raises
    InvalidRequestError when both or neither are given, or a batch is empty."""
    if (prompt is None) == (input_ids is None):
        raise InvalidRequestError("pass exactly one of prompt (text) or input_ids (token ids)")
    if prompt is not None:
        if isinstance(prompt, str):
            return [prompt], False
        items = list(prompt)
        if not items or not all(isinstance(p, str) for p in items):
            raise InvalidRequestError("prompt must be a string or a non-empty list of strings")
        return items, True
    if isinstance(input_ids, str):
        raise InvalidRequestError("input_ids must be token ids; pass text as prompt=")
    if _is_batch_of_ids(input_ids):
        return [list(ids) for ids in input_ids], True
    return [list(input_ids)], False


def check_token_ids(ids: Sequence[int], vocab_size: int, index: int) -> np.ndarray:
    """int32 ids of one prompt; InvalidRequestError when empty, non-integer or outside [0, vocab_size)."""
    arr = np.asarray(ids)
    if arr.size == 0:
        raise InvalidRequestError(f"request {index}: the prompt is empty (at least one token is needed)")
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise InvalidRequestError(f"request {index}: input_ids must be a flat list of ints")
    bad = arr[(arr < 0) | (arr >= vocab_size)]
    if bad.size:
        raise InvalidRequestError(f"request {index}: token ids {bad[:8].tolist()} are outside the "
                                  f"vocabulary [0, {vocab_size})")
    return arr.astype(np.int32)


def normalise_params(sampling_params: ParamsArg, num_requests: int, vocab_size: int) -> list[SamplingParams]:
    """One validated SamplingParams per request (a single dict/params is shared). Raises
    InvalidSamplingParamsError for bad values, InvalidRequestError for a list of the wrong length."""
    if sampling_params is None or isinstance(sampling_params, SamplingParams | Mapping):
        items = [sampling_params] * num_requests
    else:
        items = list(sampling_params)
        if len(items) != num_requests:
            raise InvalidRequestError(f"{len(items)} sampling_params for {num_requests} prompts")
    out = []
    for item in items:
        params = item if isinstance(item, SamplingParams) else SamplingParams.from_dict(item)
        out.append(params.validate(vocab_size))
    return out


def check_text(text: str, what: str) -> None:
    """Raise InvalidRequestError unless `text` is valid Unicode (a lone UTF-16 surrogate, e.g. from a JSON
    escape such as \\ud800, cannot be encoded as UTF-8 nor tokenized)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(f"{what} is not valid Unicode text: a lone surrogate "
                                  f"U+{ord(text[exc.start]):04X} at character {exc.start}; send UTF-8 text"
                                  ) from None


def prepare_request(item: str | Sequence[int], params: SamplingParams, index: int, *, tokenizer,
                    vocab_size: int, context_length: int, kv: KVCache) -> tuple[np.ndarray, SamplingParams]:
    """Tokenize and check one request against the vocabulary, the context and the pool. Returns its int32
    ids and params; a max_new_tokens beyond the context is clamped to what the context and the pool allow
    (SGLang's rule). Raises InvalidRequestError, PromptTooLongError or RequestTooLargeError; nothing is
    changed."""
    if isinstance(item, str):
        if tokenizer is None:
            raise InvalidRequestError("this engine has no tokenizer: pass input_ids instead of text")
        check_text(item, f"request {index}: the prompt")
        item = tokenizer.encode(item)
    ids = check_token_ids(item, vocab_size, index)
    if params.stop and tokenizer is None:
        raise InvalidRequestError("stop strings need a tokenizer; use stop_token_ids")
    room = context_length - ids.shape[0]
    if room < 1:
        raise PromptTooLongError(f"request {index}: prompt has {ids.shape[0]} tokens; the context length is "
                                 f"{context_length}, leaving no room for a new token")
    if params.max_new_tokens > room:
        # Beyond the context means "as many as possible" (SGLang caps it): as many as the context and the
        # pool allow. A value within the context is taken literally, and refused below if the pool can never
        # hold it.
        pool_room = kv.max_request_tokens - ids.shape[0] + 1
        params = dataclasses.replace(params, max_new_tokens=max(1, min(room, pool_room)))
    kv_tokens = ids.shape[0] + max(params.max_new_tokens - 1, 0)
    if not kv.fits_alone(kv_tokens):
        raise RequestTooLargeError(
            f"request {index}: {kv_tokens} tokens of KV (prompt + max_new_tokens - 1) exceed the pool of "
            f"{kv.num_slots} slots; raise max_total_tokens or lower max_new_tokens")
    return ids, params
