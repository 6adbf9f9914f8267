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
