"""Byte-level BPE tokenizer for the embedded model, trained with the `tokenizers` library.

Vocabulary: 256 byte symbols + 4 specials + merges up to `--vocab-size` (default 1024). The size is a
budget decision: the target's embedding and (untied) LM head cost 2 * vocab * hidden parameters, 262k at
1024 x 128 (1 MB in float32, an eighth of the ~1.8M-parameter model); 4096 would spend half the model on
them, and a ~1.3M-character corpus cannot train thousands of rare tokens anyway. Byte-level means any text
encodes (no unknown token); at 1024 the corpus averages about 3 characters per token.

Specials (gpt-oss/harmony spellings, ids 0..3): `<|endoftext|>` (document separator and eos), `<|start|>`,
`<|end|>`, `<|return|>`.

    python -m jaxserve.training.tokenizer --corpus build/embedded/corpus --out build/embedded/tokenizer

writes `tokenizer.json` and `tokenizer_config.json` (read by `jaxserve.loader.tokenizer.HFTokenizer` and by
transformers' `PreTrainedTokenizerFast`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from jaxserve.training.corpus import EOS, read_documents

SPECIAL_TOKENS = (EOS, "<|start|>", "<|end|>", "<|return|>")
# Harmony-like framing with the specials above, so /v1/chat/completions works against the embedded model (it
# was trained on plain prose, not chats: expect prose continuations, not assistant answers).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|start|>{{ message['role'] }}\n{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant\n{% endif %}"
)


def train_tokenizer(documents: Iterable[str], vocab_size: int = 1024) -> Tokenizer:
    """A byte-level BPE over `documents` (deterministic for a fixed document order)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(documents, trainer=trainer)
    return tok


def tokenizer_config(model_max_length: int) -> dict:
    return {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "pad_token": EOS,
            "bos_token": None, "add_bos_token": False, "model_max_length": model_max_length,
            "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE}


def save_tokenizer(tok: Tokenizer, directory: str | Path, model_max_length: int = 4096) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(model_max_length), indent=1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="build/embedded/corpus", help="directory with train.txt")
    parser.add_argument("--out", default="build/embedded/tokenizer")
    parser.add_argument("--vocab-size", type=int, default=1024)
    args = parser.parse_args(argv)
    docs = read_documents(Path(args.corpus) / "train.txt")
    tok = train_tokenizer(docs, args.vocab_size)
    save_tokenizer(tok, args.out)
    num_tokens = sum(len(e.ids) for e in tok.encode_batch(docs))
    num_chars = sum(map(len, docs))
    print(json.dumps({"vocab_size": tok.get_vocab_size(), "train_tokens": num_tokens,
                      "chars_per_token": round(num_chars / num_tokens, 3)}))


if __name__ == "__main__":
    main()
