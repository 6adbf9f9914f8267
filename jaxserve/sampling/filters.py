"""Top-k, top-p and min-p filters over temperature-scaled logits, vectorised over rows with one sort.

Each filter reduces to a per-row cutoff value; a token survives when its scaled logit is >= every cutoff,
otherwise it becomes -inf. Consequences worth knowing:
- Ties at a cutoff are all kept (top-k keeps every token equal to the k-th largest, as HF's TopKLogitsWarper
  does; top-p keeps every token equal to the last one it needs). Without ties this equals HF and SGLang.
- top-p works on the distribution left after top-k (renormalised), and keeps the smallest prefix of tokens,
  largest first, whose probability mass reaches top_p (a token is kept if the mass before it is < top_p).
- min-p keeps tokens whose probability is >= min_p times the top token's, computed as
  logit >= max_logit + log(min_p); renormalisation cancels, so its place in the order does not matter.
- A disabled filter (top_k -1 or >= V, top_p >= 1, min_p 0) has cutoff -inf: rows with every filter off come
  back bit-identical.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def filter_cutoffs(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array, min_p: jax.Array) -> jax.Array:
    """f32[S]: lowest scaled logit each row keeps. scaled f32[S, V]; top_k i32[S]; top_p, min_p f32[S]."""
    vocab_size = scaled.shape[-1]
    descending = -jnp.sort(-scaled, axis=-1)
    no_cutoff = jnp.full(scaled.shape[:-1], -jnp.inf, scaled.dtype)

    k_off = (top_k <= 0) | (top_k >= vocab_size)
    kth = jnp.take_along_axis(descending, (jnp.clip(top_k, 1, vocab_size) - 1)[:, None], axis=-1)[:, 0]
    cutoff_k = jnp.where(k_off, no_cutoff, kth)

    in_top_k = descending >= cutoff_k[:, None]
    probs = jax.nn.softmax(jnp.where(in_top_k, descending, -jnp.inf), axis=-1)
    # Exclusive prefix sum by shifting (not cumsum - probs, which rounds).
    mass_before = jnp.pad(jnp.cumsum(probs, axis=-1)[:, :-1], ((0, 0), (1, 0)))
    # Rank 0 always has mass_before == 0 < top_p, so at least one token stays.
    num_kept = jnp.sum(in_top_k & (mass_before < top_p[:, None]), axis=-1)
    last_kept = jnp.take_along_axis(descending, jnp.maximum(num_kept - 1, 0)[:, None], axis=-1)[:, 0]
    cutoff_p = jnp.where(top_p >= 1.0, no_cutoff, last_kept)

    cutoff_m = jnp.where(min_p > 0.0, descending[:, 0] + jnp.log(min_p), no_cutoff)
    return jnp.maximum(jnp.maximum(cutoff_k, cutoff_p), cutoff_m)


def apply_filters(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array, min_p: jax.Array) -> jax.Array:
    """f32[S, V]: `scaled` with every token below its row's cutoff set to -inf (see module docstring)."""
    cutoffs = filter_cutoffs(scaled, top_k, top_p, min_p)
    return jnp.where(scaled >= cutoffs[:, None], scaled, -jnp.inf)
