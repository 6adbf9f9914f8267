"""HFTokenizer: a tokenizer trained in-test, loaded from tokenizer.json + tokenizer_config.json."""

import json

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from jaxserve.loader.tokenizer import HFTokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [f"line {i}: the quick brown fox jumps over the lazy dog {i * 7} times, 你好" for i in range(300)]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "bos_token": None, "chat_template": "{{ messages }}"}))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 2]}))
    return path


def test_round_trip_and_specials(tok_dir):
    tok = HFTokenizer(tok_dir)
    text = "the lazy fox 你好 jumps"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.token_to_id("<|im_end|>") == 2
    assert tok.eos_token_ids == [0, 2]
    assert tok.chat_template == "{{ messages }}"
    assert tok.decode([*ids, 2]) == text  # specials skipped by default


@pytest.mark.hf
def test_ids_match_transformers_autotokenizer(tok_dir):
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(tok_dir)
    tok = HFTokenizer(tok_dir)
    for text in ["line 3: the quick brown fox", "unseen wörds 12345 你好!", ""]:
        assert tok.encode(text) == ref.encode(text)


def test_missing_tokenizer_json_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json"):
        HFTokenizer(tmp_path)
