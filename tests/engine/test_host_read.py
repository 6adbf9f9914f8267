"""`host_read.to_host`: the steppers' one device -> host read gives the arrays' values as numpy arrays, in
order, after the computation that produces them (dispatched asynchronously) has run."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.engine.host_read import to_host


def test_to_host_returns_the_values_of_pending_results_in_order():
    step = jax.jit(lambda x: (x * 2, (x + 1).astype(jnp.float32), x.sum()))
    x = jnp.arange(12, dtype=jnp.int32).reshape(3, 4)
    doubled, plus_one, total = to_host(*step(x))  # not waited for before the read
    ref = np.arange(12).reshape(3, 4)
    assert isinstance(doubled, np.ndarray) and doubled.dtype == np.int32
    np.testing.assert_array_equal(doubled, ref * 2)
    np.testing.assert_array_equal(plus_one, (ref + 1).astype(np.float32))
    assert int(total) == ref.sum()
    assert to_host() == ()
