"""`--ep-size` (gpt-oss MoE experts over the tp devices): reaches `ServerArgs`, defaults to tp, and a value
that does not divide tp is refused with the allowed values (the divisors of tp, largest first). The outputs
at ep 1, 2 and 4 with tp 4 are checked against the unsharded model in tests/models/tp_check.py."""

import re

import pytest

from jaxserve.engine.config import ServerArgs
from jaxserve.models.sharding import expert_parallel_sizes
from jaxserve.server.args import parse_launch_args


def test_ep_size_flag_reaches_the_engine_and_defaults_to_tp():
    kwargs = parse_launch_args(["--tp-size", "4", "--ep-size", "1"]).engine_kwargs
    assert kwargs == {"tp_size": 4, "ep_size": 1}
    assert ServerArgs(tp_size=4).ep_size is None  # None: experts sharded whole, ep = tp
    assert [ServerArgs(tp_size=4, ep_size=ep).ep_size for ep in (4, 2, 1)] == [4, 2, 1]


@pytest.mark.parametrize(("tp", "ep"), [(4, 3), (4, 8), (8, 6), (2, 0), (1, 2)])
def test_other_ep_sizes_are_refused_with_the_allowed_values(tp, ep):
    allowed = [d for d in range(tp, 0, -1) if tp % d == 0]  # brute force: every divisor of tp
    assert list(expert_parallel_sizes(tp)) == allowed
    message = f"ep_size={ep} with tp_size={tp}; choose one of {allowed}"
    with pytest.raises(ValueError, match=re.escape(message)):
        ServerArgs(tp_size=tp, ep_size=ep)
