"""`packed_args.ArgLayout`: unpacking what `pack` gives returns every argument leaf for leaf (host leaves of
any dtype and shape, scalars and empty arrays included, device leaves untouched), the packed arguments
match `flat_specs`, and `runner.Programs` computes through the layout what the function computes directly,
donations included."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxserve.engine import runner
from jaxserve.engine.packed_args import PACK_MAX_ELEMENTS, ArgLayout
from jaxserve.engine.runner import spec
from jaxserve.memory.host_buffers import ALIGNMENT

DTYPES = (np.int32, np.float32, np.uint32, np.bool_, np.int64)
# small shapes, and now and then one past PACK_MAX_ELEMENTS (passed as it is, not packed)
shapes = st.one_of(st.lists(st.integers(0, 4), max_size=3).map(tuple),
                   st.sampled_from([(PACK_MAX_ELEMENTS + 1,), (2, PACK_MAX_ELEMENTS // 2 + 3)]))


@st.composite
def leaf(draw):
    shape, dtype = draw(shapes), draw(st.sampled_from(DTYPES))
    seed = draw(st.integers(0, 2**16))
    values = np.random.default_rng(seed).integers(0, 100, shape).astype(dtype)
    return jnp.asarray(values) if draw(st.booleans()) else values


arguments = st.lists(st.one_of(leaf(), st.dictionaries(st.sampled_from("abcd"), leaf(), max_size=4),
                               st.lists(leaf(), max_size=4).map(tuple)), min_size=1, max_size=5)


def _same_leaf(a, b) -> bool:
    if isinstance(a, jax.Array) and not isinstance(a, np.ndarray):
        return a is b
    return a.shape == b.shape and np.dtype(a.dtype) == np.dtype(b.dtype) and np.array_equal(a, np.asarray(b))


@settings(max_examples=60, deadline=None)
@given(args=arguments, data=st.data())
def test_unpack_returns_every_leaf_and_pack_matches_the_specs(args, data):
    positions = list(range(len(args)))
    fixed = tuple(data.draw(st.sets(st.sampled_from(positions))))
    donated = tuple(data.draw(st.sets(st.sampled_from([i for i in positions if i not in fixed] or [-1]))))
    specs = tuple(jax.tree.map(spec, a) for a in args)
    layout = ArgLayout.of(specs, fixed=fixed, donated=donated)
    leaves = [tuple(jax.tree.leaves(a)) for a in args]
    flat = layout.pack(args, leaves)
    expected = layout.flat_specs(specs)
    assert jax.tree.structure(flat) == jax.tree.structure(expected)
    for got, want in zip(jax.tree.leaves(flat), jax.tree.leaves(expected), strict=True):
        assert tuple(got.shape) == tuple(want.shape) and np.dtype(got.dtype) == np.dtype(want.dtype)
    back = layout.unpack(flat)
    assert len(back) == len(args)
    for a, b in zip(args, back, strict=True):
        assert jax.tree.structure(a) == jax.tree.structure(b)
        assert all(_same_leaf(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))
    # one packed buffer per host dtype among the small host leaves of the split (not fixed, not donated)
    # positions; large host leaves are passed as they are
    split = [x for i, a in enumerate(args) if i not in fixed and i not in donated for x in jax.tree.leaves(a)
             if isinstance(x, np.ndarray)]
    small = [x for x in split if x.size <= PACK_MAX_ELEMENTS]
    assert set(layout.dtypes) == {x.dtype for x in small} and len(flat[-1]) == len(layout.dtypes)
    assert sum(b.size for b in flat[-1]) == sum(x.size for x in small)
    # the CPU backend takes them uncopied (an empty one has no data to transfer)
    assert all(b.size == 0 or b.ctypes.data % ALIGNMENT == 0 for b in flat[-1])
    passed = [x for i in range(len(args)) if i not in fixed and i not in donated
              for x in flat[i] if isinstance(x, np.ndarray)]
    assert sorted(id(x) for x in passed) == sorted(id(x) for x in split if x.size > PACK_MAX_ELEMENTS)


def test_programs_packs_host_leaves_and_keeps_donations():
    @functools.partial(jax.jit, donate_argnames=("pool",))
    def step(params, pool, meta, scale):
        rows = meta["rows"]
        written = pool.at[rows].add(params["w"] * meta["values"][:, None] * scale)
        return written, jnp.where(meta["keep"], meta["ids"], -1).sum() + rows.sum()

    programs = runner.Programs(step, "toy", fixed=(0,))
    params = {"w": jnp.arange(3, dtype=jnp.float32)}
    rng = np.random.default_rng(0)
    for call in range(3):
        meta = {"rows": np.array([0, 2], np.int32), "values": rng.normal(size=2).astype(np.float32),
                "keep": np.array([True, False, True]),
                "ids": np.array([5, 6, 7], np.int64 if call else np.int32)}
        pool = jnp.zeros((4, 3), jnp.float32)
        reference = step(params, jnp.zeros((4, 3), jnp.float32), meta, np.float32(2.0))
        out = programs.call((2,), (params, pool, meta, np.float32(2.0)), lambda a, b: a)
        assert pool.is_deleted()  # donated through the packed executable
        np.testing.assert_allclose(np.asarray(out[0]), np.asarray(reference[0]), rtol=1e-6)
        assert int(out[1]) == int(reference[1])
    assert programs.num_compiles == 2  # int32 then int64 ids: two signatures
