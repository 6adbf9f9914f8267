"""Batched continuation of prompts through the serving forward (paged KV), for draft training data.

Not the engine: a fixed batch of equal-length prompts, one prefill step, then one token per sequence per
step, sampled on the host (greedy rows where the temperature is 0). The target runs on one `KVPool` for all
layers (a hybrid model masks its sliding windows there; see `jaxserve.models.kv_layout`).
"""

from __future__ import annotations

import numpy as np

from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata
from jaxserve.memory.kv_pool import make_kv_pool
from jaxserve.models.decoder import CausalLM
from jaxserve.models.step import make_forward

PAGE_SIZE = 16


def _sample(logits: np.ndarray, temperatures: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    out = logits.argmax(-1)
    for row in np.flatnonzero(temperatures > 0):
        z = logits[row].astype(np.float64) / temperatures[row]
        p = np.exp(z - z.max())
        out[row] = rng.choice(p.size, p=p / p.sum())
    return out.astype(np.int32)


def continue_prompts(model: CausalLM, prompts: np.ndarray, num_new_tokens: int, temperatures: np.ndarray,
                     rng: np.random.Generator, forward=None) -> np.ndarray:
    """`prompts [B, P]` -> `[B, P + num_new_tokens]`: each row continued by the model at its own
    temperature (0 = greedy). `forward` (from `make_forward(model)`) may be passed to reuse compilations."""
    forward, params = forward or make_forward(model)
    batch, prompt_len = prompts.shape
    total = prompt_len + num_new_tokens
    pages_per_seq = -(-total // PAGE_SIZE)
    cfg = model.config
    pool = make_kv_pool(cfg.num_layers, batch * pages_per_seq, PAGE_SIZE, cfg.num_kv_heads, cfg.head_dim,
                        np.float32)
    pages = [list(range(1 + b * pages_per_seq, 1 + (b + 1) * pages_per_seq)) for b in range(batch)]
    page_bucket = (1 << (pages_per_seq - 1).bit_length(),)
    seqs = np.zeros((batch, total), np.int32)
    seqs[:, :prompt_len] = prompts
    done, new = 0, prompt_len
    while done < total - 1:
        steps = [SequenceStep(new, done + new, pages[b]) for b in range(batch)]
        meta = build_attention_metadata(steps, page_size=PAGE_SIZE, page_buckets=page_bucket,
                                        seq_buckets=(batch,))
        ids = np.zeros(meta.num_tokens, np.int32)
        ids[: batch * new] = seqs[:, done: done + new].reshape(-1)
        logits, pool, _ = forward(params, ids, meta, pool)
        done += new
        seqs[:, done] = _sample(np.asarray(logits)[:batch], temperatures, rng)
        new = 1
    return seqs
