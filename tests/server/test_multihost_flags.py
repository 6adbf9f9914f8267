"""Multi-host flags (`--dist-init-addr HOST:PORT --nnodes N --node-rank R`, SGLang's names): passed to
`ServerArgs`, and a bad combination is a usage error that says what is wrong, before JAX starts. The
two-process run is tests/engine/test_multihost.py."""

import jax
import pytest

from jaxserve.engine import multihost
from jaxserve.engine.config import ServerArgs
from jaxserve.server.args import parse_launch_args

ADDR = ["--dist-init-addr", "127.0.0.1:5000"]


def test_multihost_flags_reach_the_engine():
    args = parse_launch_args([*ADDR, "--nnodes", "2", "--node-rank", "1", "--tp-size", "4"])
    assert args.engine_kwargs == {"dist_init_addr": "127.0.0.1:5000", "nnodes": 2, "node_rank": 1,
                                  "tp_size": 4}
    single = ServerArgs()
    assert (single.nnodes, single.node_rank, single.dist_init_addr) == (1, 0, None)


@pytest.mark.parametrize("argv, needle", [
    ([*ADDR, "--nnodes", "2", "--node-rank", "2"], "node_rank=2 must be below nnodes=2"),
    ([*ADDR, "--nnodes", "2", "--node-rank", "-1"], "node_rank=-1 must be an int >= 0"),
    ([*ADDR, "--nnodes", "0"], "nnodes=0 must be an int >= 1"),
    (["--nnodes", "2", "--node-rank", "1"], "nnodes=2 needs dist_init_addr"),
    (["--dist-init-addr", "localhost", "--nnodes", "2"], "expected HOST:PORT"),
    (["--dist-init-addr", "h:99999", "--nnodes", "2"], "expected HOST:PORT"),
    ([*ADDR, "--nnodes", "2", "--mem-fraction-static", "0.8"], "mem_fraction_static is not supported"),
    ([*ADDR, "--nnodes", "2", "--node-rank", "3", "--attention-backend", "native"], "must be below"),
])
def test_bad_multihost_flags_are_usage_errors(argv, needle, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_launch_args(argv)
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_multihost_with_speculative_decoding_is_refused():
    with pytest.raises(ValueError, match="nnodes > 1 with speculative decoding"):
        ServerArgs(nnodes=2, dist_init_addr="10.0.0.1:5000", speculative_algorithm="EAGLE3",
                   speculative_draft_model_path="/d")


def test_the_mesh_must_use_every_processes_devices():
    multihost.check_mesh_covers_processes(jax.device_count())
    with pytest.raises(ValueError, match="tp_size equal to the global device count"):
        multihost.check_mesh_covers_processes(jax.device_count() + 1)
