"""StopChecker and IncrementalDetokenizer with toy detokenizers (multi-char and multi-byte tokens)."""

import numpy as np
import pytest

from jaxserve.sampling import AlreadyFinishedError, IncrementalDetokenizer, SamplingParams, StopChecker

# Byte-level toy: "é" is split across ids 6 and 7; id 9 is EOS and decodes to nothing (a skipped special).
BYTES = [b"He", b"llo", b" wo", b"rld", b"!", b"\n\n", b"\xc3", b"\xa9", b"ab", b"", b"lo", b" "]
EOS = 9


def byte_decode(ids):
    return b"".join(BYTES[i] for i in ids).decode("utf-8", errors="replace")


# SentencePiece-like toy: "_" marks a word start and becomes a space, except at the start of a decode.
PIECES = ["_the", "_cat", "s", "_sat", ".", "_on", "_mat", "_a"]


def piece_decode(ids):
    text = "".join(PIECES[i] for i in ids).replace("_", " ")
    return text[1:] if text.startswith(" ") else text


def _run(params, ids, decode=byte_decode, eos=(EOS,)):
    checker = StopChecker(params, eos, decode)
    for token in ids:
        if checker.append(token) is not None:
            break
    return checker


@pytest.mark.parametrize(("decode", "vocab_size"), [(byte_decode, len(BYTES)), (piece_decode, len(PIECES))])
def test_incremental_text_equals_full_decode(decode, vocab_size):
    rng = np.random.default_rng(0)
    for _ in range(200):
        ids = rng.integers(0, vocab_size, rng.integers(1, 15)).tolist()
        detokenizer = IncrementalDetokenizer(decode)
        for n, token in enumerate(ids, 1):
            detokenizer.append(token)
            assert decode(ids[:n]).startswith(detokenizer.text)
        detokenizer.flush()
        assert detokenizer.text == decode(ids)


def test_incomplete_character_is_held_until_completed():
    detokenizer = IncrementalDetokenizer(byte_decode)
    assert detokenizer.append(8) == "ab"
    assert detokenizer.append(6) == ""  # first byte of "é"
    assert detokenizer.append(7) == "é"


def test_eos_stops_and_stays_out_of_the_text():
    checker = _run(SamplingParams(), [0, 1, EOS, 3])
    assert checker.finish_reason == {"type": "stop", "matched": EOS}
    assert checker.output_ids == [0, 1, EOS] and checker.text == "Hello"


def test_ignore_eos_keeps_going_but_stop_token_ids_still_stop():
    checker = _run(SamplingParams(ignore_eos=True, stop_token_ids=[4]), [0, EOS, 1, 4, 3])
    assert checker.finish_reason == {"type": "stop", "matched": 4}
    assert checker.output_ids == [0, EOS, 1, 4] and checker.text == "Hello"


def test_stop_token_flushes_a_pending_partial_character():
    checker = _run(SamplingParams(stop_token_ids=[4]), [8, 6, 4])
    assert checker.text == "ab\ufffd"


def test_stop_string_spanning_tokens_trims_the_text():
    checker = _run(SamplingParams(stop="lo w"), [0, 1, 2, 3, 4])
    assert checker.finish_reason == {"type": "stop", "matched": "lo w"}
    assert checker.output_ids == [0, 1, 2] and checker.text == "Hel"


def test_stop_string_ending_inside_a_token_cuts_inside_it():
    checker = _run(SamplingParams(stop=["wo"]), [0, 1, 2, 3])
    assert checker.text == "Hello " and checker.output_ids == [0, 1, 2]


def test_earliest_of_several_stop_strings_wins():
    checker = _run(SamplingParams(stop=["rld", "o w", "llo"]), [0, 2, 1, 2, 3])
    # "He wo" has no match; "He wollo" matches "llo" at 5 first.
    assert checker.finish_reason == {"type": "stop", "matched": "llo"} and checker.text == "He wo"
    checker = _run(SamplingParams(stop=["ld", "o wo"]), [0, 1, 2, 3])
    assert checker.finish_reason["matched"] == "o wo" and checker.text == "Hell"


def test_stop_string_with_a_multibyte_character():
    checker = _run(SamplingParams(stop="bé"), [8, 6, 7, 0])
    assert checker.finish_reason == {"type": "stop", "matched": "bé"} and checker.text == "a"


def test_stop_strings_match_a_brute_force_model():
    rng = np.random.default_rng(1)
    for _ in range(300):
        ids = rng.integers(0, len(BYTES) - 1, 20).tolist()
        ids = [i for i in ids if i != EOS]
        stops = [byte_decode(rng.integers(0, len(BYTES), 2).tolist())[: rng.integers(1, 5)] for _ in range(2)]
        stops = [s for s in stops if s and "\ufffd" not in s] or ["zzz"]
        checker = _run(SamplingParams(stop=stops, max_new_tokens=1000), ids)
        # brute force: the first prefix whose full decode contains a stop string; cut at the earliest hit
        for n in range(1, len(ids) + 1):
            text = byte_decode(ids[:n])
            hits = [text.find(s) for s in stops if s in text]
            if hits:
                assert checker.output_ids == ids[:n] and checker.text == text[: min(hits)], (ids, stops)
                assert checker.finish_reason["type"] == "stop"
                break
        else:
            assert checker.finish_reason is None and checker.text == byte_decode(ids).rstrip("\ufffd")


def test_max_new_tokens_gives_length():
    checker = _run(SamplingParams(max_new_tokens=3), [0, 1, 2, 3])
    assert checker.finish_reason == {"type": "length", "length": 3}
    assert checker.output_ids == [0, 1, 2] and checker.text == "Hello wo"
    with pytest.raises(AlreadyFinishedError, match="already finished"):
        checker.append(3)


def test_stop_on_the_last_allowed_token_reports_stop():
    assert _run(SamplingParams(max_new_tokens=2), [0, EOS]).finish_reason == {"type": "stop", "matched": EOS}
    checker = _run(SamplingParams(max_new_tokens=2, stop="ll"), [0, 1])
    assert checker.finish_reason == {"type": "stop", "matched": "ll"} and checker.text == "He"


def test_zero_max_new_tokens_is_finished_before_any_token():
    checker = StopChecker(SamplingParams(max_new_tokens=0), [EOS], byte_decode)
    assert (
        checker.finished and checker.finish_reason == {"type": "length", "length": 0} and checker.text == ""
    )
    with pytest.raises(AlreadyFinishedError):
        checker.append(0)


def test_stream_holds_back_a_possible_stop_string_prefix():
    checker = StopChecker(SamplingParams(stop="lo wx"), [EOS], byte_decode)
    deltas = []
    for token, want in [(0, "He"), (10, ""), (11, ""), (3, "lo rld")]:
        checker.append(token)
        deltas.append(checker.stream_delta())
        assert deltas[-1] == want
    checker.append(EOS)
    deltas.append(checker.stream_delta())
    assert "".join(deltas) == checker.text == "Helo rld"


def test_stream_never_emits_the_trimmed_stop_string():
    checker = StopChecker(SamplingParams(stop="lo w"), [EOS], byte_decode)
    streamed = ""
    for token in [0, 1, 2, 3]:
        finished = checker.append(token)
        streamed += checker.stream_delta()
        if finished:
            break
    assert streamed == checker.text == "Hel"


NEVER = "\x00never"  # a stop string no toy text contains: the checker then decodes each token as it comes


@pytest.mark.parametrize(("decode", "vocab_size"), [(byte_decode, len(BYTES)), (piece_decode, len(PIECES))])
def test_text_decoded_when_read_equals_text_decoded_per_token(decode, vocab_size):
    """Without stop strings the text is decoded when read, several tokens at once: at every read, and
    streamed, it equals what a checker decoding every token as it comes (a stop string that never
    matches) has, whatever the reads' spacing, partial characters, stop tokens and length finishes."""
    rng = np.random.default_rng(2)
    for _ in range(300):
        ids = rng.integers(0, vocab_size, rng.integers(1, 16)).tolist()
        params = dict(max_new_tokens=int(rng.integers(1, 18)), stop_token_ids=[int(rng.integers(vocab_size))])
        lazy = StopChecker(SamplingParams(**params), [EOS], decode)
        eager = StopChecker(SamplingParams(**params, stop=NEVER), [EOS], decode)
        streamed = []
        for token in ids:
            done = lazy.append(token)
            assert eager.append(token) == done
            if rng.random() < 0.4 or done is not None:
                assert lazy.text == eager.text
                streamed.append(lazy.stream_delta())
            if done is not None:
                break
        streamed.append(lazy.stream_delta())
        assert lazy.text == eager.text and "".join(streamed) == lazy.text
        assert lazy.output_ids == eager.output_ids and lazy.finish_reason == eager.finish_reason


def test_extend_holds_an_incomplete_character_but_commits_what_precedes_it():
    detokenizer = IncrementalDetokenizer(byte_decode)
    assert detokenizer.extend([0, 8, 6]) == "Heab"  # "é" is not complete: its first byte is held
    assert detokenizer.extend([7, 1]) == "éllo"
    detokenizer.extend([6])
    detokenizer.flush()
    assert detokenizer.text == byte_decode([0, 8, 6, 7, 1, 6])


def test_text_decoded_when_read_equals_per_token_decoding_with_the_embedded_tokenizer():
    """The same with the embedded model's byte-level BPE tokenizer (split multi-byte characters, special
    tokens skipped): lazy text, eager text and a full decode of the ids agree."""
    from jaxserve.assets import EMBEDDED_MODEL_DIR
    from jaxserve.loader.tokenizer import HFTokenizer

    tok = HFTokenizer(EMBEDDED_MODEL_DIR)
    decode = tok.decode
    rng = np.random.default_rng(3)
    for _ in range(100):
        ids = rng.integers(0, tok.vocab_size, rng.integers(1, 40)).tolist()
        lazy = StopChecker(SamplingParams(max_new_tokens=len(ids), ignore_eos=True), [], decode)
        eager = StopChecker(SamplingParams(max_new_tokens=len(ids), ignore_eos=True, stop=NEVER), [], decode)
        for n, token in enumerate(ids, 1):
            lazy.append(token)
            eager.append(token)
            if rng.random() < 0.3:
                assert lazy.text == eager.text
                assert decode(ids[:n]).startswith(lazy.text)
        assert lazy.text == eager.text == decode(ids)
