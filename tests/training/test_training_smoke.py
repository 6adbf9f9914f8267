"""Every training script runs end to end for a few steps on a tiny corpus and config (CI never retrains)."""

import json

import numpy as np
import pytest

from jaxserve.loader.load import load_model
from jaxserve.loader.tokenizer import HFTokenizer
from jaxserve.speculative.eagle3_checkpoint import load_eagle3_draft
from jaxserve.training import corpus, draft, export, target, tokenizer

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline")
    corpus.main(["--out", str(root / "corpus"), "--modules", "json", "textwrap", "string", "--no-topics",
                 "--no-prose", "--pack-chars", "0",
                 "--heldout-fraction", "0.2"])
    tokenizer.main(["--corpus", str(root / "corpus"), "--out", str(root / "tok"), "--vocab-size", "300"])
    target.main(["--corpus", str(root / "corpus"), "--tokenizer", str(root / "tok"), "--out", str(root / "t"),
                 "--hidden-size", "32", "--intermediate-size", "32", "--sliding-window", "8",
                 "--context", "32",
                 "--batch-size", "8", "--steps", "40", "--minutes", "0", "--log-every", "10",
                 "--eval-every", "20", "--eval-windows", "8", "--save-every", "0", "--lr", "1e-2"])
    draft.main(["--target", str(root / "t"), "--tokenizer", str(root / "tok"),
                "--corpus", str(root / "corpus"), "--out", str(root / "d"), "--draft-vocab-size", "200",
                "--intermediate-size", "64",
                "--num-sequences", "32", "--eval-sequences", "8", "--prompt-len", "8", "--seq-len", "24",
                "--batch-size", "8", "--steps", "30", "--minutes", "0", "--log-every", "10",
                "--eval-every", "10", "--save-every", "0", "--lr", "1e-2"])
    export.main(["--target", str(root / "t"), "--tokenizer", str(root / "tok"), "--draft", str(root / "d"),
                 "--out", str(root / "embedded")])
    return root


def test_corpus_is_prose_without_doctests(pipeline):
    docs = corpus.read_documents(pipeline / "corpus" / "train.txt")
    assert len(docs) > 20
    assert not any(">>>" in d for d in docs)
    stats = json.loads((pipeline / "corpus" / "stats.json").read_text())
    assert stats["heldout_documents"] > 0


def test_corpus_cleaning_drops_doctests_code_and_tables():
    doc = """Summary line of a function.

    More prose that explains what the function does in a few words.

    >>> f(1)
    2

    Example::

        for x in range(10):
            print(x)

    0x00: 0x0000, 0x01: 0x0001, 0x02: 0x0002, 0x03: 0x0003
    """
    # "Example:" goes too: paragraphs of fewer than 4 words are not prose
    assert corpus.clean_docstring(doc) == ("Summary line of a function.\n\nMore prose that explains what the "
                                           "function does in a few words.")


def test_tokenizer_loads_in_the_repo_wrapper(pipeline):
    tok = HFTokenizer(pipeline / "tok")
    assert tok.vocab_size == 300
    assert tok.eos_token_ids == [tok.token_to_id("<|endoftext|>")]
    for special in ("<|start|>", "<|end|>", "<|return|>"):
        assert tok.token_to_id(special) is not None
    text = "Return a JSON string.\n"
    assert tok.decode(tok.encode(text)) == text


def test_target_training_lowers_the_loss_and_saves_a_loadable_checkpoint(pipeline):
    log = json.loads((pipeline / "t" / "training.json").read_text())
    assert log["steps"][-1]["loss"] < log["steps"][0]["loss"] - 0.5
    model = load_model(pipeline / "t", progress=False)
    assert model.config.layer_types == ("sliding_attention", "full_attention") * 2


def test_draft_training_lowers_the_loss_and_saves_a_loadable_head(pipeline):
    log = json.loads((pipeline / "d" / "training.json").read_text())
    first, last = log["steps"][0], log["steps"][-1]
    assert last["loss"][0] < first["loss"][0]
    assert len(log["final_heldout_acc"]) == 3
    head = load_eagle3_draft(pipeline / "d")
    assert head.config.draft_vocab_size == 200
    assert head.config.aux_layer_ids == (0, 1, 2)


def test_export_assembles_the_package_data_layout(pipeline):
    out = pipeline / "embedded"
    names = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "draft/config.json", "draft/model.safetensors"} <= names
    assert export.directory_bytes(out) < export.SIZE_BUDGET_BYTES
    assert np.isfinite(json.loads((out / "training.json").read_text())["final_heldout_loss"])
