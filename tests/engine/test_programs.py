"""`runner.Programs` on a toy function: an executable per signature, and `fixed` arguments whose signature
part is computed once per object (the parameters are not re-walked every step) without ever selecting the
wrong executable when the object is replaced."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.engine import runner


def _toy() -> runner.Programs:
    @jax.jit
    def fn(params, x):
        return params["w"] @ x + params["b"]

    return runner.Programs(fn, "toy", fixed=(0,))


def _params(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"w": jnp.asarray(rng.normal(size=(n, n)), jnp.float32),
            "b": jnp.asarray(rng.normal(size=n), jnp.float32)}


def _reference(params: dict, x: np.ndarray) -> np.ndarray:
    return np.asarray(params["w"]) @ x + np.asarray(params["b"])


def _no_repad(args, bucket):
    raise AssertionError("no fallback expected")


def test_fixed_arguments_are_walked_once_per_object(monkeypatch) -> None:
    programs = _toy()
    walked = []
    real = runner._arg_signature
    monkeypatch.setattr(runner, "_arg_signature", lambda arg: walked.append(arg) or real(arg))
    params = _params(4, 0)
    for seed in range(5):
        x = np.random.default_rng(seed).normal(size=4).astype(np.float32)
        np.testing.assert_allclose(programs.call((4,), (params, x), _no_repad), _reference(params, x),
                                   rtol=1e-5, atol=1e-5)
    assert sum(a is params for a in walked) == 1  # the parameters once, the other argument every call
    assert sum(a is not params for a in walked) == 5
    assert programs.num_compiles == 1


def test_a_replaced_fixed_argument_gets_its_own_signature() -> None:
    programs = _toy()
    x4, x8 = np.ones(4, np.float32), np.arange(8, dtype=np.float32)
    small, other_small, large = _params(4, 0), _params(4, 1), _params(8, 2)
    np.testing.assert_allclose(programs.call((4,), (small, x4), _no_repad), _reference(small, x4), rtol=1e-5)
    # same shapes, new object: same executable, new values
    np.testing.assert_allclose(programs.call((4,), (other_small, x4), _no_repad), _reference(other_small, x4),
                               rtol=1e-5)
    assert programs.num_compiles == 1
    # new shapes: a second executable, not the first one fed the wrong arguments
    np.testing.assert_allclose(programs.call((8,), (large, x8), _no_repad), _reference(large, x8), rtol=1e-5)
    assert programs.num_compiles == 2
    np.testing.assert_allclose(programs.call((4,), (small, x4), _no_repad), _reference(small, x4), rtol=1e-5)
    assert programs.num_compiles == 2


@jax.tree_util.register_pytree_node_class
class _CountingParams:
    """A params pytree that counts how often it is flattened (as an `nnx.State` would run Python code)."""

    flattens = 0

    def __init__(self, w, b) -> None:
        self.w, self.b = w, b

    def tree_flatten(self):
        type(self).flattens += 1
        return (self.w, self.b), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


def test_executables_take_fixed_arguments_as_leaves_walked_once() -> None:
    @jax.jit
    def fn(params, x):
        return params.w @ x + params.b

    programs = runner.Programs(fn, "toy", fixed=(0,))
    raw = _params(4, 3)
    params = _CountingParams(raw["w"], raw["b"])
    programs.call((4,), (params, np.ones(4, np.float32)), _no_repad)  # walks and compiles
    before = _CountingParams.flattens
    for seed in range(6):
        x = np.random.default_rng(seed).normal(size=4).astype(np.float32)
        np.testing.assert_allclose(programs.call((4,), (params, x), _no_repad), _reference(raw, x),
                                   rtol=1e-5, atol=1e-5)
    assert _CountingParams.flattens == before  # neither the signature nor the dispatch flattened it again


def test_donations_carry_over_and_a_donated_fixed_argument_is_refused() -> None:
    @functools.partial(jax.jit, donate_argnames=("pool",))
    def write(params, pool, x):
        return pool.at[0].set(params["w"] @ x + params["b"])

    programs = runner.Programs(write, "toy", fixed=(0,))
    params = _params(4, 4)
    pool = jnp.zeros((2, 4), jnp.float32)
    x = np.arange(4, dtype=np.float32)
    out = programs.call((4,), (params, pool, x), _no_repad)
    assert pool.is_deleted()  # donated through the wrapper
    np.testing.assert_allclose(np.asarray(out)[0], _reference(params, x), rtol=1e-5)
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(params))

    bad = runner.Programs(write, "toy", fixed=(1,))
    with pytest.raises(ValueError, match="must not be donated"):
        bad.call((4,), (params, jnp.zeros((2, 4), jnp.float32), x), _no_repad)


def test_programs_requested_counts_new_executables_only() -> None:
    programs = _toy()
    start = runner.programs_requested()
    programs.call((4,), (_params(4, 0), np.ones(4, np.float32)), _no_repad)
    assert runner.programs_requested() == start + 1
    programs.call((4,), (_params(4, 1), np.zeros(4, np.float32)), _no_repad)  # same signature
    assert runner.programs_requested() == start + 1
    programs.call((8,), (_params(8, 2), np.ones(8, np.float32)), _no_repad)
    assert runner.programs_requested() == start + 2
