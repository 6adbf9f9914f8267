"""Sampling for jaxserve: host-side parameters and stop rules, device-side batched sampling.

Host: `SamplingParams` (SGLang names), `SeedSource`, `build_sampling_batch`, `StopChecker`.
Device (jittable, fused into the step): `sample`, the `PenaltyPool` functions, `apply_filters`.

How an engine drives it (tests/sampling/test_sampling_loop.py does exactly this):
- admit: `params = SamplingParams.from_dict(d).validate(vocab_size)`; `seed = seed_source.seed_for(params)`;
  `checker = StopChecker(params, eos_ids, detokenize)`; if `params.uses_penalties`, give the request a pool
  row: `clear_rows` then `mark_prompt_tokens` (per prefill chunk, or once with the whole prompt).
- each step, for the rows that sample: `SamplingRow(params, seed, len(checker.output_ids), pool_row)` ->
  `build_sampling_batch(rows, bucket)`; inside the jitted step `out = sample(logits, batch, pool)` and
  `pool = update_counts(pool, batch.penalty_rows, out.token_ids)`. A row whose token will be discarded (a
  prefill chunk that does not end the prompt) must not be in the batch with a pool row.
- after the step: `checker.append(token)` per request; finished when it returns a reason.
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
    penalise,
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
    "penalise",
    "row_keys",
    "sample",
    "seed_words",
    "update_counts",
]
