"""Eagle3Draft forward vs an independent numpy implementation of the EAGLE-3 head, on random weights."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.models.config import ConfigError
from jaxserve.speculative.eagle3_draft import Eagle3Config, default_aux_layer_ids
from tests.speculative.eagle3_helpers import (
    AUX_IDS,
    DRAFT_VOCAB,
    HIDDEN,
    VOCAB,
    reference_step,
    reference_tensors,
    run_paged,
    tiny_draft,
    tiny_draft_config,
)

TOL = 2e-5


def _inputs(n: int, seed: int):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, n).astype(np.int32)
    aux = rng.normal(0, 1.0, (n, len(AUX_IDS) * HIDDEN)).astype(np.float32)
    return ids, aux


def _rel(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def draft():
    model = tiny_draft()
    embedding = np.random.default_rng(9).normal(0, 1.0, (VOCAB, HIDDEN)).astype(np.float32)
    return model, embedding, reference_tensors(model)


@pytest.mark.parametrize("page_size", [1, 4])
def test_prefill_matches_numpy_reference(draft, page_size):
    model, embedding, tensors = draft
    ids, aux = _inputs(12, seed=1)
    (logits, hidden), = run_paged(model, embedding, [(ids, aux)], page_size=page_size)
    ref_logits, ref_hidden = reference_step(tensors, model.config, embedding, ids, aux, np.arange(12))
    assert _rel(logits, ref_logits) <= TOL
    assert _rel(hidden, ref_hidden) <= TOL


def test_chunked_extend_then_chain_steps_on_own_hidden_match_reference(draft):
    """Prefill in two chunks (captured target states, fc applied), then two chain steps that feed the
    draft's own pre-norm output back (fc skipped), each attending to everything before it."""
    model, embedding, tensors = draft
    ids, aux = _inputs(9, seed=2)
    step_ids = np.asarray([5, 17], np.int32)
    outs = run_paged(model, embedding, [(ids[:6], aux[:6]), (ids[6:], aux[6:])], page_size=4)
    h_last = outs[1][1][-1:]
    chain = run_paged(model, embedding, [(ids[:6], aux[:6]), (ids[6:], aux[6:]), (step_ids[:1], h_last)],
                      page_size=4)
    h_step1 = chain[2][1]
    chain = run_paged(model, embedding, [(ids[:6], aux[:6]), (ids[6:], aux[6:]), (step_ids[:1], h_last),
                                         (step_ids[1:], h_step1)], page_size=4)

    cache = {"k": [], "v": [], "pos": []}
    ref = [reference_step(tensors, model.config, embedding, ids[:6], aux[:6], np.arange(6), cache),
           reference_step(tensors, model.config, embedding, ids[6:], aux[6:], np.arange(6, 9), cache)]
    ref.append(reference_step(tensors, model.config, embedding, step_ids[:1], ref[1][1][-1:], np.asarray([9]),
                              cache))
    ref.append(reference_step(tensors, model.config, embedding, step_ids[1:], ref[2][1], np.asarray([10]),
                              cache))
    for (logits, hidden), (ref_logits, ref_hidden) in zip(chain, ref, strict=True):
        assert _rel(logits, ref_logits) <= TOL
        assert _rel(hidden, ref_hidden) <= TOL


def test_draft_ids_map_to_target_ids_through_d2t(draft):
    model, _, tensors = draft
    d2t = tensors["d2t"]
    draft_ids = jnp.arange(DRAFT_VOCAB)
    target_ids = np.asarray(model.to_target_ids(draft_ids))
    np.testing.assert_array_equal(target_ids, np.arange(DRAFT_VOCAB) + d2t)
    np.testing.assert_array_equal(np.flatnonzero(tensors["t2d"]), target_ids)
    logits = np.random.default_rng(0).normal(size=(3, DRAFT_VOCAB)).astype(np.float32)
    full = np.asarray(model.target_vocab_logits(jnp.asarray(logits)))
    assert full.shape == (3, VOCAB)
    np.testing.assert_array_equal(full[:, target_ids], logits)
    assert np.all(np.isneginf(np.delete(full, target_ids, axis=1)))
    # argmax in the target vocabulary = the mapped argmax of the draft vocabulary
    np.testing.assert_array_equal(full.argmax(-1), target_ids[logits.argmax(-1)])


def test_wrong_hidden_width_is_rejected(draft):
    model, embedding, _ = draft
    with pytest.raises(ValueError, match="width"):
        run_paged(model, embedding, [(np.zeros(3, np.int32), np.zeros((3, 2 * HIDDEN), np.float32))])


def test_config_round_trip_and_aux_layer_convention():
    cfg = tiny_draft_config()
    assert cfg.aux_layer_ids == AUX_IDS
    assert Eagle3Config.from_dict(cfg.to_dict()) == cfg
    # SpecForge's default capture, output-of-layer ids: gpt-oss-20b (24 layers) -> 1, 11, 20
    assert default_aux_layer_ids(24) == (1, 11, 20)
    raw = cfg.to_dict()
    del raw["eagle_config"]
    assert Eagle3Config.from_dict(raw, target_num_layers=24).aux_layer_ids == (1, 11, 20)
    with pytest.raises(ConfigError, match="target_num_layers"):
        Eagle3Config.from_dict(raw)
    with pytest.raises(ConfigError, match="not all in"):
        Eagle3Config.from_dict(cfg.to_dict(), target_num_layers=2)
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        Eagle3Config.from_dict({**cfg.to_dict(), "num_hidden_layers": 2})


def test_jitted_forward_with_donated_pool_equals_eager(draft):
    from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata
    from jaxserve.speculative.eagle3_draft import make_draft_forward, make_draft_pool

    model, embedding, _ = draft
    ids, aux = _inputs(10, seed=4)
    meta = build_attention_metadata([SequenceStep(10, 10, [3, 1, 2])], page_size=4, page_buckets=(4,))
    ids_p = np.pad(ids, (0, meta.num_tokens - 10))
    aux_p = np.pad(aux, ((0, meta.num_tokens - 10), (0, 0)))
    eager = model(ids_p, aux_p, meta, make_draft_pool(model.config, 4, 4, np.float32), embedding)
    forward, params = make_draft_forward(model)
    pool = make_draft_pool(model.config, 4, 4, np.float32)
    logits, hidden, new_pool = forward(params, ids_p, aux_p, meta, pool, embedding)
    # jit fuses and reorders fp32 sums, so agreement is to rounding at the values' scale (hidden values
    # reach ~30 here; XLA's CPU code differs per vector width), not bit-exact.
    def close(actual, desired):
        np.testing.assert_allclose(np.asarray(actual), np.asarray(desired), rtol=1e-5,
                                   atol=1e-5 * max(1.0, float(np.abs(np.asarray(desired)).max())))

    close(hidden, eager[1])
    assert pool.data.is_deleted()  # donated
    close(logits, eager[0])
    close(new_pool.data, eager[2].data)
    forward(params, ids_p, aux_p, meta, new_pool, embedding)
    assert forward._cache_size() == 1


@pytest.mark.parametrize("backend", ["xla", "native"])
def test_extend_computes_the_layer_at_the_kept_rows_and_writes_every_tokens_kv(backend):
    """`Eagle3Draft.extend` (the layer over each sequence's last token only) against the numpy reference:
    three sequences of a ragged step, one with a cached prefix; the kept rows' output states equal the
    reference's, the pool equals what the full forward writes, and a next step that attends to every
    written key matches the reference too (so no token's K/V was skipped)."""
    from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata
    from jaxserve.speculative.eagle3_draft import make_draft_pool

    model = tiny_draft(tiny_draft_config(), seed=3)
    model.backend = backend
    tensors = reference_tensors(model)
    embedding = np.random.default_rng(5).normal(0, 1.0, (VOCAB, HIDDEN)).astype(np.float32)
    page_size, lens, cached = 4, [7, 1, 5], [0, 0, 6]  # sequence 2 continues a 6-token prefix
    pages = [[1, 2], [3], [4, 5, 6]]
    pool = make_draft_pool(model.config, 8, page_size, np.float32)
    prefix_ids, prefix_aux = _inputs(6, seed=6)
    meta0 = build_attention_metadata([SequenceStep(6, 6, pages[2])], page_size=page_size, page_buckets=(4,))
    pad0 = meta0.num_tokens - 6
    _, _, pool = model(np.pad(prefix_ids, (0, pad0)), np.pad(prefix_aux, ((0, pad0), (0, 0))), meta0, pool,
                       embedding)
    ids, aux = _inputs(sum(lens), seed=7)
    seqs = [SequenceStep(n, c + n, p) for n, c, p in zip(lens, cached, pages, strict=True)]
    meta = build_attention_metadata(seqs, page_size=page_size, seq_buckets=(4,), page_buckets=(4,))
    pad = meta.num_tokens - sum(lens)
    ids_p, aux_p = np.pad(ids, (0, pad)), np.pad(aux, ((0, pad), (0, 0)))
    _, full_hidden, full_pool = model(ids_p, aux_p, meta, pool, embedding)
    rows = np.asarray(meta.sample_idx)
    kept, pool = model.extend(ids_p, aux_p, meta, pool, embedding, rows)
    np.testing.assert_allclose(np.asarray(pool.data), np.asarray(full_pool.data), rtol=1e-6, atol=1e-6)
    starts = np.cumsum([0, *lens])
    for s, (n, c) in enumerate(zip(lens, cached, strict=True)):
        cache = {"k": [], "v": [], "pos": []}
        if c:
            reference_step(tensors, model.config, embedding, prefix_ids, prefix_aux, np.arange(c), cache)
        _, ref_h = reference_step(tensors, model.config, embedding, ids[starts[s]: starts[s + 1]],
                                  aux[starts[s]: starts[s + 1]], np.arange(c, c + n), cache)
        assert _rel(kept[s], ref_h[-1]) <= TOL
        assert _rel(kept[s], np.asarray(full_hidden)[rows[s]]) <= TOL
        # one more token on the draft's own state: it reads every key the extend wrote
        step = build_attention_metadata([SequenceStep(1, c + n + 1, pages[s])], page_size=page_size,
                                        page_buckets=(4,))
        tok = np.asarray([11], np.int32)
        logits, _, _ = model(np.pad(tok, (0, step.num_tokens - 1)),
                             np.pad(np.asarray(kept[s:s + 1]), ((0, step.num_tokens - 1), (0, 0))),
                             step, pool, embedding)
        ref_logits, _ = reference_step(tensors, model.config, embedding, tok, ref_h[-1:],
                                       np.asarray([c + n]), cache)
        assert _rel(np.asarray(logits)[:1], ref_logits) <= TOL
