"""Sampling for jaxserve: host-side parameters and stop rules, device-side batched sampling.

Host: `SamplingParams` (SGLang names), `SeedSource`, `build_sampling_batch`, `StopChecker`.
Device (jittable, fused into the step): `sample`, the `PenaltyPool` functions, `apply_filters`.
"""

from jaxserve.sampling.batch import NO_PENALTY_ROW, SamplingBatch, SamplingRow, build_sampling_batch
from jaxserve.sampling.detokenize import IncrementalDetokenizer
from jaxserve.sampling.errors import AlreadyFinishedError, InvalidSamplingParamsError
from jaxserve.sampling.filters import FilterMethod, apply_filters, filter_cutoffs
from jaxserve.sampling.params import SamplingParams
from jaxserve.sampling.penalties import (
    PenaltyPool,
    apply_penalties,
    clear_rows,
    mark_prompt_tokens,
    new_penalty_pool,
    update_counts,
)
from jaxserve.sampling.sampler import SampleOutput, row_keys, sample
from jaxserve.sampling.seeds import SeedSource, seed_words
from jaxserve.sampling.stop import FinishReason, StopChecker

__all__ = [
    "NO_PENALTY_ROW",
    "AlreadyFinishedError",
    "FilterMethod",
    "FinishReason",
    "IncrementalDetokenizer",
    "InvalidSamplingParamsError",
    "PenaltyPool",
    "SampleOutput",
    "SamplingBatch",
    "SamplingParams",
    "SamplingRow",
    "SeedSource",
    "StopChecker",
    "apply_filters",
    "apply_penalties",
    "build_sampling_batch",
    "clear_rows",
    "filter_cutoffs",
    "mark_prompt_tokens",
    "new_penalty_pool",
    "row_keys",
    "sample",
    "seed_words",
    "update_counts",
]
