"""Reusable helpers for model parity tests: tiny HF checkpoints, full-sequence and paged jaxserve runs.

The paged runner mimics a serving step loop: several sequences advance together in ragged batches (uneven
prefill chunks, then one token per step), their pages interleaved in the pool, swa pages of tokens that have
left every window dropped (page id 0) for hybrid models.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata
from jaxserve.models.decoder import CausalLM
from jaxserve.models.step import make_forward

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=512)
# initializer_range well above HF's 0.02 so that attention is far from uniform and logits spread out:
# masking or rotary mistakes then show up far above the 1e-4 tolerance.
INIT_RANGE = 0.15
TOLERANCE = 1e-4  # jaxserve vs transformers, float32, relative to the largest |logit|
PAGED_TOLERANCE = 1e-5  # paged/chunked run vs one full-sequence step of the same jaxserve model


def perturb_vectors(hf_model, seed: int, std: float = 0.2) -> None:
    """Add noise to every bias, norm weight and sink (transformers initialises them to 0 or 1), so that a
    vector loaded into the wrong place, or dropped, shows up in the logits."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            if p.ndim == 1 or name.endswith("_bias"):
                p.add_(torch.randn(p.shape, generator=gen) * std)


def make_hf_checkpoint(directory: Path, model_type: str, *, seed: int = 0, perturb: bool = True, **overrides):
    """Save a random float32 transformers model of `model_type` (TINY + `overrides`) to `directory`;
    returns the torch model (eval mode, eager attention) for reference forwards. With `perturb`, biases
    and norm weights are randomised too (`perturb_vectors`)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    kwargs = {**TINY, "initializer_range": INIT_RANGE, **overrides}
    config = AutoConfig.for_model(model_type, **kwargs)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32).eval()
    if perturb:
        perturb_vectors(model, seed)
    model.save_pretrained(directory)
    return model


def hf_logits(hf_model, ids: Sequence[int], *, hidden_states: bool = False):
    """Float32 logits `[T, vocab]` of one sequence (and the tuple of hidden states when asked)."""
    import torch

    with torch.no_grad():
        out = hf_model(torch.tensor(np.asarray(ids)[None]), output_hidden_states=hidden_states)
    logits = out.logits[0].float().numpy()
    if hidden_states:
        return logits, [h[0].float().numpy() for h in out.hidden_states]
    return logits


def rel_error(ours: np.ndarray, ref: np.ndarray) -> float:
    """max |ours - ref| / max |ref|."""
    return float(np.abs(np.asarray(ours, np.float64) - ref).max() / np.abs(ref).max())


def random_ids(n: int, vocab: int, seed: int) -> np.ndarray:
    return np.random.RandomState(seed).randint(0, vocab, size=n).astype(np.int32)


class Runner:
    """A model with its jitted forward (`make_forward`) and split parameters (share one per module)."""

    def __init__(self, model: CausalLM):
        self.model = model
        self.forward, self.params = make_forward(model)


def full_logits(runner: Runner, ids: Sequence[int], *, kv_dtype=np.float32):
    """One sequence in one step through page_size-1 pools: returns (logits [T, vocab], aux or None)."""
    n = len(ids)
    layout = runner.model.kv_layout
    # the pool sized to a power of two: a caller growing `ids` one token at a time recompiles only when a
    # bucket changes, not at every length (the slots past n are never read)
    pools = layout.make_pools(max(64, 1 << (n - 1).bit_length()), 1, kv_dtype)
    meta = build_attention_metadata(
        [SequenceStep(n, n, list(range(1, n + 1)), list(range(1, n + 1)) if layout.hybrid else None)],
        page_size=1, with_swa=layout.hybrid)
    tokens = np.zeros(meta.num_tokens, np.int32)
    tokens[:n] = ids
    logits, _, aux = runner.forward(runner.params, tokens, meta, pools, return_all_logits=True)
    return np.asarray(logits)[:n], None if aux is None else np.asarray(aux)[:n]


def paged_logits(runner: Runner, seqs: Sequence[np.ndarray], chunk_sizes: Sequence[Sequence[int]], *,
                 page_size: int, window: int | None = None, kv_dtype=np.float32,
                 seed: int = 0) -> list[np.ndarray]:
    """Run `seqs` together: step k feeds each sequence its k-th prefill chunk (`chunk_sizes[s]`), after
    which it decodes one token per step; returns each sequence's logits `[len, vocab]` (all tokens).

    Pages are handed out shuffled across sequences. For hybrid models, swa pages whose keys are older
    than every current token's window (`window`) are dropped from the swa page table (id 0).
    """
    layout = runner.model.kv_layout
    rng = np.random.RandomState(seed)
    pages_per_seq = [-(-len(s) // page_size) for s in seqs]
    total = sum(pages_per_seq)
    full_ids, swa_ids = rng.permutation(total) + 1, rng.permutation(total) + 1
    starts = np.cumsum([0, *pages_per_seq])
    own_full = [full_ids[starts[i]:starts[i + 1]] for i in range(len(seqs))]
    own_swa = [swa_ids[starts[i]:starts[i + 1]] for i in range(len(seqs))]
    pools = layout.make_pools(total, page_size, kv_dtype)
    max_pages = max(pages_per_seq)
    page_bucket = (1 << (max_pages - 1).bit_length(),)

    done = [0] * len(seqs)
    outputs = [np.zeros((len(s), runner.model.config.vocab_size), np.float32) for s in seqs]
    step = 0
    while any(d < len(s) for d, s in zip(done, seqs, strict=True)):
        steps, tokens, active = [], [], []
        for i, s in enumerate(seqs):
            if done[i] >= len(s):
                continue
            n = chunk_sizes[i][step] if step < len(chunk_sizes[i]) else 1
            n = min(n, len(s) - done[i])
            kv_len = done[i] + n
            swa = None
            if layout.hybrid:
                swa = own_swa[i].copy()
                first_visible = done[i] - window + 1  # oldest key the first new token can see
                swa[(np.arange(len(swa)) + 1) * page_size - 1 < first_visible] = 0
            steps.append(SequenceStep(n, kv_len, own_full[i], swa))
            tokens.extend(s[done[i]:kv_len])
            active.append((i, done[i], kv_len))
            done[i] = kv_len
        meta = build_attention_metadata(steps, page_size=page_size, with_swa=layout.hybrid,
                                        token_buckets=(16, 32, 64), seq_buckets=(len(seqs),),
                                        page_buckets=page_bucket)
        ids = np.zeros(meta.num_tokens, np.int32)
        ids[: len(tokens)] = tokens
        logits, pools, _ = runner.forward(runner.params, ids, meta, pools, return_all_logits=True)
        logits = np.asarray(logits)
        t = 0
        for i, begin, end in active:
            outputs[i][begin:end] = logits[t: t + end - begin]
            t += end - begin
        step += 1
    return outputs


def load_variant(directory: Path, **config_changes) -> CausalLM:
    """Load `directory`'s weights into a model whose ModelConfig has `config_changes` applied (e.g.
    `layer_types=("full_attention",) * n` to show that a checkpoint's sliding window matters)."""
    from jaxserve.loader.load import load_params
    from jaxserve.models.build import abstract_model
    from jaxserve.models.config import ModelConfig

    config = dataclasses.replace(ModelConfig.from_file(directory), **config_changes)
    return load_params(abstract_model(config), directory, progress=False)
