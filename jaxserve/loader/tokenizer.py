"""Tokenizer from `tokenizer.json` (+ specials from `tokenizer_config.json`) via the `tokenizers` library."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer


class HFTokenizer:
    """Encode/decode with a checkpoint's fast tokenizer. `eos_token_ids` merges `tokenizer_config.json`'s
    `eos_token` with `generation_config.json`/`config.json` `eos_token_id` (int or list) when present."""

    def __init__(self, directory: str | Path):
        directory = Path(directory)
        path = directory / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(f"no tokenizer.json in {directory}")
        self._tok = Tokenizer.from_file(str(path))
        cfg = _read_json(directory / "tokenizer_config.json")
        self.bos_token = _token_text(cfg.get("bos_token"))
        self.eos_token = _token_text(cfg.get("eos_token"))
        self.chat_template = cfg.get("chat_template")
        self.add_bos = bool(cfg.get("add_bos_token", False)) and self.bos_token is not None
        ids = set()
        if self.eos_token is not None and self._tok.token_to_id(self.eos_token) is not None:
            ids.add(self._tok.token_to_id(self.eos_token))
        for name in ("generation_config.json", "config.json"):
            eos = _read_json(directory / name).get("eos_token_id")
            ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.eos_token_ids = sorted(ids)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self.add_bos:
            bos = self._tok.token_to_id(self.bos_token)
            if not ids or ids[0] != bos:
                ids = [bos, *ids]
        return ids

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def to_json(self) -> str:
        """The tokenizer.json text (for libraries that build their own view of the vocabulary)."""
        return self._tok.to_str()


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _token_text(token: str | dict | None) -> str | None:
    return token.get("content") if isinstance(token, dict) else token
