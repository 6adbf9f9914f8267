"""A tiny random Llama checkpoint with a trained byte-level BPE tokenizer and a chat template, written to a
directory so that a server process can load it with `--model-path`. By default the tests serve the shipped
embedded default instead; `JAXSERVE_TEST_EMBEDDED=0` selects this tiny checkpoint."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.models.helpers import make_hf_checkpoint

VOCAB_SIZE = 512
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_CORPUS = [
    "You are a helpful, respectful and honest assistant.",
    "Human: Give me a fully functional FastAPI server. Show the python code.\n\nAssistant:",
    "The quick brown fox jumps over the lazy dog. Hello world, hello server!",
    "def main():\n    print('hello')\n    return 0\n",
    "Question: what is the capital of France? Answer: Paris.",
] * 20


def write_trained_tokenizer(directory: Path, *, chat_template: bool = True) -> None:
    """Train a byte-level BPE of `VOCAB_SIZE` ids (with `<|end|>` as EOS) on a small corpus; write
    tokenizer.json and tokenizer_config.json (with a chat template unless `chat_template` is False)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=["<|end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS, trainer)
    assert tok.get_vocab_size() <= VOCAB_SIZE
    tok.save(str(directory / "tokenizer.json"))
    config = {"eos_token": "<|end|>"}
    if chat_template:
        config["chat_template"] = CHAT_TEMPLATE
    (directory / "tokenizer_config.json").write_text(json.dumps(config))


# harmony's special tokens, in id order 0..6 of `write_harmony_tokenizer`'s tokenizer
HARMONY_SPECIALS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>",
                    "<|call|>"]


def write_harmony_tokenizer(directory: Path, chat_template: str) -> None:
    """A 512-id byte-level BPE whose first ids are `HARMONY_SPECIALS` (a gpt-oss tokenizer in miniature),
    with `chat_template`, as tokenizer.json and tokenizer_config.json in `directory`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=HARMONY_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the user greets hello there need weather analysis final commentary json "
                             "functions get_weather city Paris assistant system user"] * 20, trainer)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": chat_template}))


# Tiny gpt-oss: sliding window 8 on alternate layers, attention sinks, MoE (hybrid KV pools + SWA radix tree),
# the architecture of the embedded default.
GPT_OSS = dict(num_hidden_layers=3, head_dim=16, sliding_window=8, num_local_experts=4, num_experts_per_tok=2,
               intermediate_size=64, swiglu_limit=1.5)


def write_tiny_checkpoint(directory: Path, *, model_type: str = "llama", chat_template: bool = True) -> Path:
    """Random tiny `model_type` ("llama" or "gpt_oss"; vocab 512, context 256) + trained tokenizer in
    `directory`; returns it."""
    extra = GPT_OSS if model_type == "gpt_oss" else {}
    make_hf_checkpoint(directory, model_type, seed=0, vocab_size=VOCAB_SIZE, max_position_embeddings=256,
                       eos_token_id=None, bos_token_id=None, **extra)
    write_trained_tokenizer(directory, chat_template=chat_template)
    return directory


def write_spec_pair(directory: Path) -> tuple[Path, Path]:
    """A tiny Llama target (tied embeddings, so its greedy output often repeats a token) + trained tokenizer,
    and an EAGLE-3 head that predicts "the captured token again" (as tests/speculative/spec_pairs'
    copy draft): rounds accept a realistic mix of 0..S drafts. Returns (target dir, draft dir)."""
    import jax.numpy as jnp

    from jaxserve.loader.load import load_model
    from jaxserve.speculative.eagle3_checkpoint import save_eagle3_draft
    from jaxserve.speculative.eagle3_draft import random_draft
    from tests.speculative.spec_pairs import AUX, HIDDEN, draft_config

    target_dir, draft_dir = directory / "target", directory / "draft"
    target_dir.mkdir()
    make_hf_checkpoint(target_dir, "llama", seed=0, vocab_size=VOCAB_SIZE, max_position_embeddings=256,
                       num_hidden_layers=3, tie_word_embeddings=True, initializer_range=0.1,
                       eos_token_id=None, bos_token_id=None)
    write_trained_tokenizer(target_dir)
    target = load_model(target_dir, progress=False, aux_hidden_state_layer_ids=AUX)
    draft = random_draft(draft_config(vocab=VOCAB_SIZE), seed=0)
    draft.fc.kernel[...] = jnp.concatenate([jnp.eye(HIDDEN), jnp.zeros((2 * HIDDEN, HIDDEN))], 0)
    draft.lm_head.kernel[...] = target.embed.embed.embedding[...].T
    for kernel in (draft.midlayer.self_attn.o_proj.kernel, draft.midlayer.mlp.down_proj.kernel):
        kernel[...] = jnp.zeros_like(kernel[...])
    save_eagle3_draft(draft, draft_dir)
    return target_dir, draft_dir


def use_embedded() -> bool:
    """True (the default) when tests serve the shipped embedded default; JAXSERVE_TEST_EMBEDDED=0 switches
    to a tiny random checkpoint built in-test. The embedded model must exist (it ships with the package)."""
    from jaxserve.assets import embedded_model_available

    if os.environ.get("JAXSERVE_TEST_EMBEDDED", "1") == "0":
        return False
    assert embedded_model_available(), "jaxserve/assets/embedded is missing (see jaxserve.training)"
    return True
