"""`StopChecker`: decides, token by token on the host, when a request is finished and what its text is.

Checks after each appended token, in this order:
1. the token is in `stop_token_ids`, or is an EOS id and `ignore_eos` is false -> stop; the token stays in
   `output_ids` but not in `text`;
2. the new text completes a stop string -> stop; `text` is cut before the earliest match (the string may
   span several tokens or end inside one);
3. `max_new_tokens` tokens generated -> length.
finish_reason follows SGLang's meta_info: {"type": "stop", "matched": id_or_string} or
{"type": "length", "length": max_new_tokens}. Unlike SGLang, which checks the length first, a stop token or
string on the last allowed token reports "stop" (and trims), as OpenAI's API does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jaxserve.sampling.detokenize import Detokenize, IncrementalDetokenizer
from jaxserve.sampling.errors import AlreadyFinishedError
from jaxserve.sampling.params import SamplingParams

FinishReason = dict[str, Any]


class StopChecker:
    """Per-request stop state. `detokenize(ids) -> str` should already honour skip_special_tokens.

    Without stop strings nothing needs the text to decide when to stop, so `append` only records the token
    and the text is decoded when it is read (`text`, `stream_delta`): the tokens appended since the last
    read in one window decode (`IncrementalDetokenizer.extend`), not two decodes per token on the step's
    path. The text is the same either way.

    A request with max_new_tokens == 0 is finished ("length", 0) on construction.
    """

    def __init__(self, params: SamplingParams, eos_token_ids: Iterable[int], detokenize: Detokenize) -> None:
        self._params = params
        self._stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        self._stop_strings: tuple[str, ...] = params.stop  # normalised to a tuple by SamplingParams
        self._longest_stop = max((len(s) for s in self._stop_strings), default=0)
        self._detokenizer = IncrementalDetokenizer(detokenize)
        self._decoded = 0  # output ids given to the detokenizer (all but the latest ones when lazy)
        self._text_end: int | None = None  # where `text` is cut once finished
        self._streamed_chars = 0
        self.output_ids: list[int] = []
        self.finish_reason: FinishReason | None = None
        if params.max_new_tokens == 0:
            self._finish({"type": "length", "length": 0})

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def text(self) -> str:
        """Output text so far; once finished, trimmed at the stop string (stop tokens never enter it)."""
        if self._decoded < len(self.output_ids):
            self._catch_up()
        return self._detokenizer.text[: self._text_end]

    def _catch_up(self) -> None:
        """Decode the ids appended since the last read (no stop strings: see the class), leaving out a
        final stop token, and flush once finished as `_finish` does for eager decoding."""
        ids = self.output_ids
        # without stop strings a "stop" finish is a stop token, the last id
        end = len(ids) - (self.finish_reason is not None and self.finish_reason["type"] == "stop")
        self._detokenizer.extend(ids[self._decoded: end])
        self._decoded = len(ids)
        if self.finished:
            self._detokenizer.flush()

    def append(self, token_id: int) -> FinishReason | None:
        """Record one sampled token; return the finish reason if it finishes the request, else None."""
        if self.finished:
            raise AlreadyFinishedError(
                f"request already finished ({self.finish_reason}); cannot append token {token_id}"
            )
        self.output_ids.append(token_id)
        if token_id in self._stop_ids:
            return self._finish({"type": "stop", "matched": token_id})
        if self._stop_strings:
            self._decoded += 1
            old_num_chars = len(self._detokenizer.text)
            if self._detokenizer.append(token_id):
                match = self._find_stop_string(max(0, old_num_chars - self._longest_stop + 1))
                if match is not None:
                    position, stop_string = match
                    return self._finish({"type": "stop", "matched": stop_string}, text_end=position)
        if len(self.output_ids) >= self._params.max_new_tokens:
            return self._finish({"type": "length", "length": self._params.max_new_tokens})
        return None

    def stream_delta(self) -> str:
        """Text not yet streamed that can no longer change: while running, a tail that could still grow
        into a stop string is held back; once finished, the rest of the (trimmed) text."""
        text = self.text
        safe_end = len(text) if self.finished else len(text) - self._stop_prefix_suffix(text)
        delta = text[self._streamed_chars : max(safe_end, self._streamed_chars)]
        self._streamed_chars += len(delta)
        return delta

    def _finish(self, reason: FinishReason, text_end: int | None = None) -> FinishReason:
        if text_end is None and self._stop_strings:
            self._detokenizer.flush()
            self._decoded = len(self.output_ids)  # a stop token is not decoded
        self._text_end = text_end
        self.finish_reason = reason
        return reason

    def _find_stop_string(self, start: int) -> tuple[int, str] | None:
        """Earliest (position, string) of a stop string occurring at or after `start`."""
        text = self._detokenizer.text
        found = [(text.find(s, start), i, s) for i, s in enumerate(self._stop_strings)]
        hits = [(position, i, s) for position, i, s in found if position >= 0]
        if not hits:
            return None
        position, _, stop_string = min(hits)
        return position, stop_string

    def _stop_prefix_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        longest = 0
        for stop_string in self._stop_strings:
            for num_chars in range(min(len(stop_string) - 1, len(text)), longest, -1):
                if text.endswith(stop_string[:num_chars]):
                    longest = num_chars
                    break
        return longest
