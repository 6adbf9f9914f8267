"""Validation and normalisation of `generate` arguments (SGLang's shapes: one prompt or a list, one
sampling_params dict or a list) into per-request token ids and `SamplingParams`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxserve.engine.errors import InvalidRequestError
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
