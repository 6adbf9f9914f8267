"""The zero-copy safetensors reader agrees with the `safetensors` library and returns read-only map views."""

import ml_dtypes
import numpy as np
import pytest

from jaxserve.loader.errors import CorruptCheckpointError
from jaxserve.loader.safetensors_reader import SafetensorsFile, checkpoint_files


@pytest.fixture
def written(tmp_path):
    import torch
    from safetensors.torch import save_file

    tensors = {"w": torch.randn(3, 5), "b16": torch.randn(4, 2).to(torch.bfloat16),
               "i": torch.arange(6, dtype=torch.int32).reshape(2, 3), "empty": torch.zeros(0, 4)}
    save_file(tensors, tmp_path / "model.safetensors")
    return tmp_path / "model.safetensors", tensors


@pytest.mark.hf
def test_values_dtypes_and_shapes_match_the_writer(written):
    path, tensors = written
    f = SafetensorsFile(path)
    assert sorted(f.names()) == sorted(tensors)
    for name, t in tensors.items():
        got = f.get(name)
        assert got.shape == tuple(t.shape) == f.shape(name)
        np.testing.assert_array_equal(got.astype(np.float32), t.float().numpy())
    assert f.get("b16").dtype == ml_dtypes.bfloat16
    assert f.get("i").dtype == np.int32


@pytest.mark.hf
def test_tensors_are_read_only_views_of_the_file_map(written):
    f = SafetensorsFile(written[0])
    w = f.get("w")
    assert not w.flags.writeable and not w.flags.owndata  # no private copy in anonymous memory


def test_header_pointing_past_the_data_is_corrupt(tmp_path):
    header = b'{"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}'
    path = tmp_path / "bad.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)
    with pytest.raises(CorruptCheckpointError, match=r"bad\.safetensors.*'x'"):
        SafetensorsFile(path)


def test_unknown_dtype_is_corrupt(tmp_path):
    header = b'{"x": {"dtype": "Q3", "shape": [1], "data_offsets": [0, 1]}}'
    path = tmp_path / "odd.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0")
    with pytest.raises(CorruptCheckpointError, match="malformed"):
        SafetensorsFile(path)


def test_directory_without_safetensors_is_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors"):
        checkpoint_files(tmp_path)
