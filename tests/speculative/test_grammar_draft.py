"""`grammar_draft.walk_drafts` against a brute-force reference: fresh matchers replayed token by token give
every node's mask, the kept drafts are exactly those the grammar allows (forced tokens substituted), the cut
comes at the first refused draft, and the request's matcher ends in the state it started in."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxserve.assets import EMBEDDED_MODEL_DIR
from jaxserve.loader.tokenizer import HFTokenizer
from jaxserve.sampling.grammar import GrammarBackend
from jaxserve.speculative.grammar_draft import walk_drafts, walk_tree

TOKENIZER = HFTokenizer(EMBEDDED_MODEL_DIR)
VOCAB = TOKENIZER.vocab_size
BACKEND = GrammarBackend(TOKENIZER.to_json(), VOCAB, TOKENIZER.eos_token_ids)
GRAMMARS = [("regex", "[a-z ]+"), ("regex", "(cat|dog)s?-[0-9]{2}"), ("ebnf", 'root ::= ("yes" | "no") "!"'),
            ("json_schema", json.dumps({"type": "object", "properties": {"a": {"type": "integer"}},
                                        "required": ["a"], "additionalProperties": False}))]
STEPS = 4


def _mask(matcher) -> np.ndarray:
    row = np.zeros((1, matcher.num_words), np.uint32)
    matcher.fill(row, 0)
    return row[0]


def _allowed(mask: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little")[:VOCAB])


@settings(max_examples=25, deadline=None, derandomize=True)
@given(grammar=st.sampled_from(GRAMMARS), prefix=st.integers(0, 3), seed=st.integers(0, 2**16),
       p_allowed=st.sampled_from([0.5, 0.9, 1.0]))
def test_walk_matches_brute_force_replay(grammar, prefix, seed, p_allowed):
    rng = np.random.default_rng(seed)
    matcher, guide = BACKEND.matcher(*grammar), BACKEND.matcher(*grammar)
    done = []
    for _ in range(prefix):  # a request some tokens into its output
        allowed = _allowed(_mask(guide))
        if guide.stopped or not allowed.size:
            break
        token = int(rng.choice(allowed))
        done.append(token)
        guide.advance(token)
        matcher.advance(token)
    drafts = []  # mostly tokens the grammar allows, sometimes any token
    for _ in range(STEPS):
        allowed = _allowed(_mask(guide))
        keep = allowed.size and rng.random() < p_allowed
        token = int(rng.choice(allowed)) if keep else int(rng.integers(VOCAB))
        drafts.append(token)
        if not guide.stopped and token in set(allowed.tolist()):
            guide.advance(token)
    before = _mask(matcher)
    tokens, depth, bitmask = walk_drafts([None, matcher], np.array([drafts, drafts], np.int32),
                                         BACKEND.num_words)
    nodes = STEPS + 1
    assert depth[0] == STEPS and (bitmask[:nodes] == 0xFFFFFFFF).all() and tokens[0].tolist() == drafts
    assert np.array_equal(_mask(matcher), before)  # rolled back
    d = int(depth[1])
    replay = BACKEND.matcher(*grammar)
    for token in done:
        replay.advance(token)
    for j in range(nodes):
        mask = _mask(replay)
        if j <= d:
            assert np.array_equal(bitmask[nodes + j], mask), j
        if j == STEPS:
            break
        allowed = _allowed(mask)
        if j < d:
            kept = int(tokens[1, j])
            assert kept in set(allowed.tolist())
            assert kept == drafts[j] or allowed.tolist() == [kept]  # a draft or the token the grammar forces
            replay.advance(kept)
        else:  # the cut: the grammar ended, or refuses the draft and forces nothing
            assert replay.stopped or (drafts[j] not in set(allowed.tolist()) and allowed.size != 1)
            break


@settings(max_examples=25, deadline=None, derandomize=True)
@given(grammar=st.sampled_from(GRAMMARS), seed=st.integers(0, 2**16), p_allowed=st.sampled_from([0.5, 0.9]))
def test_tree_walk_matches_brute_force_replay(grammar, seed, p_allowed):
    rng = np.random.default_rng(seed)
    nodes, k = 7, 2
    parents = np.array([-1] + [int(rng.integers(0, v)) for v in range(1, nodes)], np.int32)
    children = np.full((nodes, k), -1, np.int32)
    tokens = np.zeros(nodes, np.int32)
    guide = {}
    for v in range(1, nodes):  # mostly tokens the path's grammar state allows, sometimes any token
        replay = BACKEND.matcher(*grammar)
        path, u = [], int(parents[v])
        while u > 0:
            path.append(int(tokens[u]))
            u = int(parents[u])
        ok = True
        for token in reversed(path):
            ok = ok and not replay.stopped and token in set(_allowed(_mask(replay)).tolist())
            if ok:
                replay.advance(token)
        allowed = _allowed(_mask(replay)) if ok and not replay.stopped else np.zeros(0, int)
        keep = allowed.size and rng.random() < p_allowed
        tokens[v] = int(rng.choice(allowed)) if keep else int(rng.integers(VOCAB))
        free = np.flatnonzero(children[parents[v]] < 0)
        if free.size:
            children[parents[v], free[0]] = v
        else:
            parents[v] = -2  # padding: no room under its parent
        guide[v] = ok
    matcher = BACKEND.matcher(*grammar)
    before = _mask(matcher)
    new_tokens, new_children, bitmask = walk_tree([matcher], tokens[None], parents[None], children[None],
                                                  BACKEND.num_words)
    assert np.array_equal(_mask(matcher), before)  # rolled back
    kept = {0} | {int(c) for c in new_children[0].reshape(-1) if c >= 0}
    for v in range(nodes):
        path, u = [], v
        while u > 0:
            path.append(int(new_tokens[0, u]))
            u = int(parents[u])
        replay = BACKEND.matcher(*grammar)
        for token in reversed(path[1:]):
            replay.advance(token)
        if v in kept:
            if v > 0:  # allowed by its parent's state: a draft, or the one token that state forces
                allowed = _allowed(_mask(replay)).tolist()
                assert not replay.stopped and path[0] in allowed
                assert path[0] == tokens[v] or allowed == [path[0]]
                replay.advance(path[0])
            assert np.array_equal(bitmask[v], _mask(replay)), v
            siblings = [int(new_tokens[0, c]) for c in new_children[0, v] if c >= 0]
            assert len(siblings) == len(set(siblings))
        else:
            assert (bitmask[v] == 0xFFFFFFFF).all()
            p = int(parents[v])
            if p >= 0 and p in kept and v > 0:  # cut although its parent is kept: its grammar ended, or
                allowed = _allowed(_mask(replay)).tolist()  # refused and forced nothing, or a kept sibling
                taken = {int(new_tokens[0, c]) for c in new_children[0, p] if c >= 0}  # has the token
                forced = allowed[0] if len(allowed) == 1 else None
                assert replay.stopped or (tokens[v] in taken if tokens[v] in allowed else
                                          forced is None or forced in taken)
