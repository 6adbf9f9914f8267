"""The pieces together, as an engine drives them: a toy decode loop over a shrinking batch.

Toy model: the next-token logits are row `last_token` of a fixed random [V, V] table. Requests leave the batch
as they finish, so later rows move; a seeded request must still produce the same tokens as when run alone,
and a greedy penalised request must equal a plain numpy greedy loop over the reference penalties.
"""

import jax
import jax.numpy as jnp
import numpy as np

import tests.sampling.sampling_reference as ref
from jaxserve.sampling import (
    SamplingParams,
    SamplingRow,
    StopChecker,
    build_sampling_batch,
    clear_rows,
    mark_prompt_tokens,
    new_penalty_pool,
    sample,
    update_counts,
)

VOCAB, BUCKET, EOS = 12, 4, 0
TABLE = (np.random.default_rng(5).normal(size=(VOCAB, VOCAB)) * 2).astype(np.float32)
PIECES = [""] + [chr(ord("a") + i) for i in range(VOCAB - 1)]


def _decode(ids):
    return "".join(PIECES[i] for i in ids)


@jax.jit
def _step(logits, batch, pool):
    out = sample(logits, batch, pool)
    return out, update_counts(pool, batch.penalty_rows, out.token_ids)


def _generate(requests):
    """requests: list of (prompt ids, SamplingParams with a seed). Returns each request's output ids."""
    pool = new_penalty_pool(len(requests), VOCAB)
    for row, (prompt, _) in enumerate(requests):
        pool = clear_rows(pool, jnp.array([row]))
        pool = mark_prompt_tokens(pool, jnp.full(len(prompt), row), jnp.asarray(prompt))
    checkers = [StopChecker(params, [EOS], _decode) for _, params in requests]
    running = [r for r, checker in enumerate(checkers) if not checker.finished]
    while running:
        rows = [
            SamplingRow(requests[r][1], requests[r][1].seed, len(checkers[r].output_ids), penalty_row=r)
            for r in running
        ]
        last = [checkers[r].output_ids[-1] if checkers[r].output_ids else requests[r][0][-1] for r in running]
        logits = np.zeros((BUCKET, VOCAB), np.float32)
        logits[: len(running)] = TABLE[last]
        out, pool = _step(logits, build_sampling_batch(rows, BUCKET), pool)
        for r, token in zip(running, np.asarray(out.token_ids).tolist(), strict=False):
            checkers[r].append(token)
        running = [r for r in running if not checkers[r].finished]
    return [checker.output_ids for checker in checkers]


def test_requests_give_the_same_tokens_alone_and_together():
    requests = [
        ([3, 4], SamplingParams(temperature=0.9, top_k=6, seed=1, max_new_tokens=9)),
        (
            [5],
            SamplingParams(
                temperature=1.2, top_p=0.8, presence_penalty=0.5, seed=2, max_new_tokens=25, ignore_eos=True
            ),
        ),
        ([1, 1, 2], SamplingParams(temperature=0.0, repetition_penalty=1.3, seed=3, max_new_tokens=14)),
        ([7], SamplingParams(min_p=0.1, frequency_penalty=0.4, seed=4, max_new_tokens=0)),
        ([2], SamplingParams(ignore_eos=True, seed=5, max_new_tokens=18)),
    ]
    together = _generate(requests[:BUCKET]) + _generate(requests[BUCKET:])
    alone = [_generate([request])[0] for request in requests]
    assert together == alone
    # rows move: request 0 stops early (EOS), 1 and 2 run on in lower rows; 3 never samples
    assert [len(ids) for ids in alone] == [7, 25, 14, 0, 18]


def test_greedy_penalised_request_equals_a_numpy_greedy_loop():
    prompt, repetition, frequency = [1, 1, 2], 1.5, 0.8
    params = SamplingParams(
        temperature=0.0,
        repetition_penalty=repetition,
        frequency_penalty=frequency,
        seed=3,
        max_new_tokens=14,
        ignore_eos=True,
    )
    want = []
    while len(want) < params.max_new_tokens:
        last = want[-1] if want else prompt[-1]
        token = int(np.argmax(ref.penalise(TABLE[last], prompt, want, repetition, frequency, 0.0)))
        want.append(token)
    assert _generate([(prompt, params)])[0] == want
    assert len(set(want)) > 3  # the penalty really steers the loop away from repeats
