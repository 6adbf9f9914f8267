"""Tiny (target, EAGLE-3 draft) pairs for the speculative engine tests, and engine builders.

Two kinds of draft:
- `random_pair`: a random head (acceptance ~0): every round rejects, exercising the reject/free path.
- `copy_pair`: a target with tied embeddings and mid-sized layer weights (its greedy output often repeats
  the last token for a while, then jumps) and a hand-built head that predicts "the token of the captured
  state again": fc passes the first captured state through, attention and MLP outputs are zeroed and the LM
  head is the target's embedding matrix. Rounds then accept 0 .. S drafts, a realistic mix.
Losslessness never depends on the draft's quality: the reference is always the plain engine's greedy output.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from jaxserve.api import Engine
from jaxserve.layers.backends import DEFAULT_BACKEND
from jaxserve.loader.load import load_model
from jaxserve.speculative.eagle3_draft import Eagle3Config, Eagle3Draft, random_draft
from tests.engine.conftest import GPT_OSS, small_buckets
from tests.models.helpers import make_hf_checkpoint

AUX = (0, 1, 2)
HIDDEN = 64


def draft_config(vocab: int = 256, draft_vocab: int | None = None) -> Eagle3Config:
    return Eagle3Config.from_dict(dict(
        architectures=["LlamaForCausalLMEagle3"], hidden_size=HIDDEN, intermediate_size=96,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=vocab,
        draft_vocab_size=draft_vocab, rms_norm_eps=1e-5, max_position_embeddings=512,
        eagle_config={"eagle_aux_hidden_state_layer_ids": list(AUX)}))


def copy_draft(target, backend: str = DEFAULT_BACKEND) -> Eagle3Draft:
    draft = random_draft(draft_config(), seed=0, backend=backend)
    emb = target.embed.embed.embedding[...]
    draft.fc.kernel[...] = jnp.concatenate([jnp.eye(HIDDEN), jnp.zeros((2 * HIDDEN, HIDDEN))], 0)
    draft.lm_head.kernel[...] = emb.T
    attn_out, mlp_out = draft.midlayer.self_attn.o_proj.kernel, draft.midlayer.mlp.down_proj.kernel
    attn_out[...] = jnp.zeros_like(attn_out[...])
    mlp_out[...] = jnp.zeros_like(mlp_out[...])
    return draft


@functools.cache
def checkpoint(kind: str) -> Path:
    """'llama': 3-layer Llama, tied embeddings, init 0.1. 'gpt_oss': the engine tests' hybrid SWA gpt-oss
    (window 8), 4 layers, tied embeddings. Written once per session to a temporary directory."""
    path = Path(tempfile.mkdtemp(prefix=f"spec_{kind}_"))
    if kind == "llama":
        make_hf_checkpoint(path, "llama", seed=0, num_hidden_layers=3, tie_word_embeddings=True,
                           initializer_range=0.1)
    else:
        make_hf_checkpoint(path, "gpt_oss", seed=1, **{**GPT_OSS, "num_hidden_layers": 4},
                           tie_word_embeddings=True, initializer_range=0.1)
    return path


def target(kind: str, backend: str = DEFAULT_BACKEND):
    """`checkpoint(kind)` loaded with its attention on `backend`; one model per (kind, backend), so every
    engine over it shares its compiled steps."""
    return _target(kind, backend)


@functools.cache
def _target(kind: str, backend: str):
    return load_model(checkpoint(kind), progress=False, aux_hidden_state_layer_ids=AUX, backend=backend)


def draft(kind: str, which: str, backend: str = DEFAULT_BACKEND) -> Eagle3Draft:
    """The `which` ("copy" or "random") head for `target(kind, backend)`, one per argument set."""
    return _draft(kind, which, backend)


@functools.cache
def _draft(kind: str, which: str, backend: str) -> Eagle3Draft:
    if which == "copy":
        return copy_draft(target(kind, backend), backend)
    return random_draft(draft_config(draft_vocab=128), seed=3, vocab_map=_vocab_map(), backend=backend)


def _vocab_map():
    from jaxserve.speculative.vocab_map import build_vocab_map

    return build_vocab_map(np.random.default_rng(0).integers(0, 1000, 256), 128)


def engine(kind: str, *, which: str | None = "copy", page_size: int = 1, max_total_tokens: int = 1024,
           num_steps: int = 3, max_running: int = 8, chunk: int = 64, backend: str = DEFAULT_BACKEND,
           **kwargs) -> Engine:
    """An engine over `target(kind, backend)`; speculative with `draft(kind, which, backend)` unless `which`
    is None."""
    max_pages = min(-(-600 // page_size), max_total_tokens // page_size)
    spec = {} if which is None else dict(draft_model=draft(kind, which, backend),
                                          speculative_algorithm="EAGLE3", speculative_num_steps=num_steps,
                                          speculative_policy="always")
    return Engine(model=target(kind, backend), page_size=page_size, max_total_tokens=max_total_tokens,
                  chunked_prefill_size=chunk, max_running_requests=max_running,
                  buckets=small_buckets(max_tokens=chunk, max_seqs=max_running, max_pages=max_pages),
                  **{**spec, **kwargs})


_PLAIN: dict[str, list[dict]] = {}


def plain_outputs(kind: str, prompts, params, **kwargs) -> list[dict]:
    """The plain engine's `generate` outputs (the lossless reference), computed once per argument set: test
    variants that differ only in the speculative engine (page size, chain or tree) share one reference.
    Read them, do not mutate them."""
    key = repr((kind, prompts, params, sorted(kwargs.items())))
    if key not in _PLAIN:
        _PLAIN[key] = engine(kind, which=None, **kwargs).generate(input_ids=prompts, sampling_params=params)
    return _PLAIN[key]


def shared_prefix_prompts(seed: int, n: int = 6) -> list[list[int]]:
    """Prompts in families: a common stem, then one to three diverging tails of random lengths."""
    rng = np.random.RandomState(seed)
    stems = [rng.randint(0, 256, size=rng.randint(4, 20)).tolist() for _ in range(3)]
    return [stems[i % 3] + rng.randint(0, 256, size=rng.randint(1, 12)).tolist() for i in range(n)]
