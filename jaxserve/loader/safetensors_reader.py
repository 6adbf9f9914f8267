"""Zero-copy reading of `*.safetensors` files, one tensor at a time.

The format: 8-byte little-endian header length N, N bytes of JSON (`name -> {dtype, shape, data_offsets}`,
plus optional `__metadata__`), then the raw little-endian data. Tensors are returned as read-only numpy views
of a memory map, so reading a checkpoint never holds a second copy in anonymous memory; bf16 uses
`ml_dtypes.bfloat16`, which the `safetensors` numpy API does not support (hence this small reader).
"""

from __future__ import annotations

import json
import math
import mmap
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np

from jaxserve.loader.errors import CorruptCheckpointError

_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
    "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
}
INDEX_NAME = "model.safetensors.index.json"


class SafetensorsFile:
    """One open safetensors file: `names()`, `shape(name)`, `get(name)` (a read-only numpy view)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            size = self.path.stat().st_size
            if size < 8:
                raise CorruptCheckpointError(f"{self.path}: {size} bytes is too short for a safetensors file")
            header_len = int.from_bytes(f.read(8), "little")
            if header_len > size - 8:
                raise CorruptCheckpointError(f"{self.path}: header length {header_len} exceeds the file size")
            try:
                header = json.loads(f.read(header_len))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise CorruptCheckpointError(f"{self.path}: header is not valid JSON ({e})") from None
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size > 8 + header_len else None
        if not isinstance(header, dict):
            raise CorruptCheckpointError(f"{self.path}: header is not a JSON object")
        header.pop("__metadata__", None)
        self._data_start = 8 + header_len
        self._entries = {}
        for name, entry in header.items():
            self._entries[name] = self._check_entry(name, entry, size - self._data_start)

    def _check_entry(self, name: str, entry: dict, data_bytes: int) -> tuple[np.dtype, tuple[int, ...], int]:
        try:
            dtype = np.dtype(_DTYPES[entry["dtype"]])
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(o) for o in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise CorruptCheckpointError(f"{self.path}: tensor {name!r} has a malformed header entry "
                                         f"{entry!r}") from None
        if not 0 <= begin <= end <= data_bytes or end - begin != math.prod(shape) * dtype.itemsize:
            raise CorruptCheckpointError(
                f"{self.path}: tensor {name!r} ({entry['dtype']} {list(shape)}) has data_offsets "
                f"[{begin}, {end}] inconsistent with its size or the file ({data_bytes} data bytes)")
        return dtype, shape, begin

    def names(self) -> list[str]:
        return list(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entries[name][1]

    def get(self, name: str) -> np.ndarray:
        dtype, shape, begin = self._entries[name]
        if math.prod(shape) == 0:
            return np.zeros(shape, dtype)
        return np.frombuffer(self._map, dtype, math.prod(shape), self._data_start + begin).reshape(shape)

    def release(self, name: str) -> None:
        """Drop the resident file pages of tensor `name` (call once it has been copied out): keeps the
        loader's resident set at about one tensor of file pages. A later `get` reads the file again."""
        dtype, shape, begin = self._entries[name]
        nbytes = math.prod(shape) * dtype.itemsize
        if self._map is None or nbytes == 0 or not hasattr(mmap, "MADV_DONTNEED"):
            return
        start = (self._data_start + begin) // mmap.PAGESIZE * mmap.PAGESIZE
        self._map.madvise(mmap.MADV_DONTNEED, start, self._data_start + begin + nbytes - start)


def checkpoint_files(directory: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint: those named by `model.safetensors.index.json` when present
    (each must exist), else every `*.safetensors` in the directory, sorted. Raises if there are none."""
    directory = Path(directory)
    index = directory / INDEX_NAME
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CorruptCheckpointError(f"{index}: not a valid safetensors index ({e!r})") from None
        files = [directory / name for name in sorted(set(weight_map.values()))]
        for path in files:
            if not path.exists():
                raise CorruptCheckpointError(f"{index} names shard {path.name}, which does not exist")
        return files
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {directory}")
    return files


def iter_tensor_names(files: list[Path]) -> Iterator[tuple[SafetensorsFile, str]]:
    """Every `(file, tensor name)` of the checkpoint, file by file in order."""
    for path in files:
        f = SafetensorsFile(path)
        for name in f.names():
            yield f, name
