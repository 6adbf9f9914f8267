"""`import jaxserve` stays cheap: the engine (and JAX) load on first use of `jaxserve.Engine`."""

import subprocess
import sys


def test_import_jaxserve_does_not_import_jax():
    code = ("import sys, jaxserve; assert 'jax' not in sys.modules; "
            "jaxserve.Engine; jaxserve.ServerArgs; assert 'jax' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_server_args_reject_unknown_and_bad_values():
    import pytest

    from jaxserve.engine import ServerArgs

    with pytest.raises(TypeError, match="page_szie"):
        ServerArgs.from_kwargs({"page_szie": 16})
    with pytest.raises(ValueError, match="max_running_requests"):
        ServerArgs(max_running_requests=64, chunked_prefill_size=32)
    with pytest.raises(ValueError, match="page_size"):
        ServerArgs(page_size=0)
    assert ServerArgs(max_total_tokens=100, page_size=16).num_pages == 6
