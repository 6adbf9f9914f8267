"""The Pallas kernels `pallas_tpu` and `pallas_gpu` equal the `native` oracle, in interpret mode on CPU.

TPU, two interpreters: Pallas's TPU interpreter (`pltpu.InterpretParams`: simulated HBM/VMEM, DMAs and
semaphores, so a copy that is never waited on, or a read past the pool, fails the test) cannot reshape or
bitcast a ref, so it runs the kernel with K/V read by plain indexing; the HLO interpreter
(`interpret=True`) runs the device's packed strided loads (32-bit words of bf16/fp8 rows). Each variant
names the one it uses; low-precision pools run on both. GPU: `interpret=True`. Hypothesis
draws ragged steps (`pallas_cases`); variants fix the static options (page size 1, 16 or 64, window, sinks,
soft-cap, scale, tree masks, key/query block sizes, split-K). Every output row is compared, padding rows
included. Page-table rows address 64 keys, 128 at page size 64 (two pages: sequences cross a page edge).

Interpret mode misses the real compilers' rules, so each kernel is also lowered for its platform on CPU
(Mosaic TPU under an abstract TPU mesh; Triton for CUDA): block shapes, alignment and unsupported
primitives fail here. What only a real device checks: Mosaic's and Triton's own compilation after
lowering (layouts, VMEM/shared-memory limits) and the speed.

Tolerances: float32 pools 2e-5 (reassociated sums); bfloat16 3e-2 (probabilities are rounded to bf16 for
the value matmul at a different running max than native's); fp8 pools 1e-5 (values are dequantized
exactly to float32 on both sides).
"""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import AbstractDevice, AbstractMesh

from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata
from jaxserve.layers.backends import available_backends, get_backend
from jaxserve.memory.kv_pool import make_kv_pool, write_kv
from jaxserve.server.attention_choice import best_backend, resolve_attention_backend
from tests.layers.pallas_cases import (
    MAX_KEYS,
    SEQS,
    Layout,
    assert_pool_not_copied,
    fit,
    ragged_case,
    run_native,
    seq_strategy,
)

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

KERNELS = ["pallas_tpu", "pallas_gpu"]


def _run(name, q, k, v, pool, meta, sinks, window, softcap, scale, options):
    options = {"interpret": True, **dict(options)}
    return get_backend(name)(q, k, v, pool, 0, meta, sliding_window=window, sinks=sinks,
                             logit_softcap=softcap, scale=scale, **options)


_run = jax.jit(_run, static_argnames=("name", "window", "softcap", "scale", "options"))
TPU_INTERPRETER = ("interpret", pltpu.InterpretParams())

# (page_size, trees, window, sinks, softcap, scale, kernel options)
VARIANTS = {
    "pallas_tpu": [
        (1, False, 5, True, 2.0, None, (("block_keys", 8), ("block_tokens", 8), TPU_INTERPRETER)),
        (1, True, None, False, None, None, (("block_keys", 4), ("block_tokens", 16))),
        (16, True, 20, True, None, 0.7, (("block_keys", 16), ("block_tokens", 8), TPU_INTERPRETER)),
        (16, True, 20, True, None, 0.7, (("block_keys", 16), ("block_tokens", 8))),
        (16, False, None, False, 1.5, None, (("block_keys", 32), ("block_tokens", 8))),
        (64, True, 40, True, None, None, (("block_keys", 64), ("block_tokens", 8), TPU_INTERPRETER)),
    ],
    "pallas_gpu": [
        (1, False, 5, True, 2.0, None, (("block_keys", 16), ("block_tokens", 8), ("kv_splits", 1))),
        (1, True, None, True, None, None, (("block_keys", 16), ("block_tokens", 8), ("kv_splits", 3))),
        (16, True, 20, False, None, 0.7, (("block_keys", 16), ("block_tokens", 16), ("kv_splits", 2))),
        (16, False, None, True, 1.5, None, ()),  # defaults: block sizes and splits picked by shape
        (64, True, 40, True, 2.0, None, (("block_keys", 32), ("block_tokens", 8), ("kv_splits", 2))),
    ],
}


@pytest.fixture(autouse=True)
def _fresh_tpu_interpreter():
    yield
    pltpu.reset_tpu_interpret_mode_state()  # an interpreter error must not leak into the next test


@pytest.mark.parametrize(("name", "variant"), [(name, v) for name in KERNELS for v in VARIANTS[name]])
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_kernel_equals_native_on_ragged_steps(name, variant, data, seed):
    page_size, trees, window, use_sinks, softcap, scale, options = variant
    max_keys = max(MAX_KEYS, 2 * page_size)
    seqs = data.draw(st.lists(seq_strategy(max_keys), min_size=1, max_size=SEQS), label="seqs")
    rng = np.random.RandomState(seed)
    pool, meta, q, k, v = ragged_case(Layout(), page_size, fit(seqs), trees, rng, max_keys)
    sinks = jnp.asarray(rng.randn(q.shape[1]), jnp.float32) if use_sinks else None
    want, want_pool = run_native(q, k, v, pool, meta, sinks, window, softcap, scale)
    got, got_pool = _run(name, q, k, v, pool, meta, sinks, window, softcap, scale, options)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(got_pool.data), np.asarray(want_pool.data))


# (layout, page_size): GQA ratios 1, 3 (padded to 4 rows per token on the GPU) and 8; head_dim 64/128/256
LOW_PRECISION = [
    (Layout(8, 1, 128, jnp.bfloat16, jnp.bfloat16), 16),
    pytest.param(Layout(6, 2, 64, jnp.float8_e4m3fn, jnp.float32), 16, marks=pytest.mark.slow),
    pytest.param(Layout(4, 4, 256, jnp.bfloat16, jnp.bfloat16), 1, marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("name", "options"),
                         [("pallas_tpu", ()), ("pallas_tpu", (TPU_INTERPRETER,)), ("pallas_gpu", ())])
@pytest.mark.parametrize(("layout", "page_size"), LOW_PRECISION)
def test_kernel_equals_native_on_low_precision_pools_and_head_dims(name, options, layout, page_size):
    rng = np.random.RandomState(7)
    pool, meta, q, k, v = ragged_case(layout, page_size, [(30, 6), (17, 1), (0, 9), (47, 1)], True, rng)
    sinks = jnp.asarray(rng.randn(layout.q_heads), jnp.float32)
    want, _ = run_native(q, k, v, pool, meta, sinks, 24, None, None)
    got, got_pool = _run(name, q, k, v, pool, meta, sinks, 24, None, None, (("block_keys", 16), *options))
    assert got.dtype == q.dtype and got_pool.data.dtype == pool.data.dtype
    atol = 3e-2 if layout.compute == jnp.bfloat16 else 1e-5
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=atol)


@pytest.mark.parametrize("name", KERNELS)
def test_swa_tables_are_read_for_swa_layers(name):
    """Keys outside the window sit in evicted (page id 0) swa pages; the visible ones are found."""
    rng = np.random.RandomState(3)
    pool = make_kv_pool(1, 12, 2, 2, 16, jnp.float32)
    swa_pages = [0, 0, 7, 9]  # key indices 0-3 left every window and were evicted
    meta = build_attention_metadata([SequenceStep(2, 8, [1, 2, 3, 4], swa_pages)], page_size=2,
                                    with_swa=True)
    idx = np.arange(4, 6)
    pool = write_kv(pool, 0, jnp.asarray(np.asarray(swa_pages)[idx // 2] * 2 + idx % 2),
                    *(jnp.asarray(rng.randn(2, 2, 16), jnp.float32) for _ in "kv"))
    q, k, v = (jnp.asarray(rng.randn(meta.num_tokens, h, 16), jnp.float32) for h in (4, 2, 2))
    want = get_backend("native")(q, k, v, pool, 0, meta, use_swa_tables=True, sliding_window=3)[0]
    got = get_backend(name)(q, k, v, pool, 0, meta, use_swa_tables=True, sliding_window=3)[0]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-6)


@pytest.mark.xla_optimized
@pytest.mark.parametrize("name", KERNELS)
def test_donated_two_layer_step_never_copies_the_pool(name):
    """Each layer writes, then the kernel reads the new pool: XLA keeps the donated pool in place (checked
    on the CPU executable of the interpret-mode kernel; the device kernel reads the same operand)."""
    rng = np.random.RandomState(5)
    pool = make_kv_pool(2, 32, 4, 2, 16, jnp.bfloat16)
    meta = build_attention_metadata([SequenceStep(6, 20, list(range(1, 6))), SequenceStep(1, 9, [7, 8, 9])],
                                    page_size=4)
    q = jnp.asarray(rng.randn(meta.num_tokens, 4, 16), jnp.bfloat16)

    def two_layers(q, pool, meta):
        x = q
        for layer in range(2):  # layer 1's K/V depend on layer 0's output, as in a model
            kv = x[:, :2]
            x, pool = get_backend(name)(x, kv, kv, pool, layer, meta, block_keys=16, interpret=True)
        return x, pool

    compiled = jax.jit(two_layers, donate_argnums=1).lower(q, pool, meta).compile()
    assert_pool_not_copied(compiled.as_text(), pool)


def test_unsupported_shapes_fail_with_the_rule():
    rng = np.random.RandomState(0)
    fp8 = Layout(2, 1, 16, jnp.float8_e4m3fn, jnp.float32)
    pool, meta, q, k, v = ragged_case(fp8, 16, [(5, 3)], False, rng)
    with pytest.raises(ValueError, match="odd"):
        get_backend("pallas_tpu")(q, k, v, pool, 0, meta)
    pool, meta, q, k, v = ragged_case(Layout(), 16, [(5, 3)], False, rng)
    with pytest.raises(ValueError, match="multiple of 8"):
        get_backend("pallas_tpu")(q, k, v, pool, 0, meta, block_tokens=4)
    with pytest.raises(ValueError, match="power of two"):
        get_backend("pallas_gpu")(q, k, v, pool, 0, meta, block_tokens=12)
    pool, meta, q, k, v = ragged_case(Layout(head_dim=24), 16, [(5, 3)], False, rng)
    with pytest.raises(ValueError, match="power-of-two page_size and head_dim"):
        get_backend("pallas_gpu")(q, k, v, pool, 0, meta)


_TPU_MESH = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(device_kind="TPU v6 lite", num_cores=1,
                                                                      platform="tpu"))


# (q_heads, kv_heads, head_dim, pool dtype, page_size, tree mask): the shapes of served models
LOWERING = [
    (64, 8, 64, jnp.bfloat16, 16, True),  # gpt-oss: head_dim 64, sinks, windows, EAGLE trees
    (32, 8, 128, jnp.bfloat16, 64, False),  # Llama-3-8B
    (8, 1, 256, jnp.float32, 1, True),
    (16, 2, 128, jnp.float8_e4m3fn, 16, False),
]


@pytest.mark.parametrize(("name", "platform"), [("pallas_tpu", "tpu"), ("pallas_gpu", "cuda")])
@pytest.mark.parametrize(("q_heads", "kv_heads", "head_dim", "dtype", "page_size", "tree"), LOWERING)
def test_kernel_lowers_for_its_platform(name, platform, q_heads, kv_heads, head_dim, dtype, page_size, tree):
    """Lowering only (no device): Mosaic TPU or Triton reject block shapes, alignment and primitives here."""
    kv_len = 512
    pool = make_kv_pool(1, kv_len // page_size + 1, page_size, kv_heads, head_dim, dtype)
    steps = [SequenceStep(5, kv_len, list(range(1, 1 + kv_len // page_size))),
             SequenceStep(1, page_size, [kv_len // page_size + 1])]
    meta = build_attention_metadata(steps, page_size=page_size,
                                    custom_mask=np.ones((6, kv_len), bool) if tree else None)
    compute = jnp.float32 if dtype == jnp.float32 else jnp.bfloat16
    q = jnp.zeros((meta.num_tokens, q_heads, head_dim), compute)
    k = jnp.zeros((meta.num_tokens, kv_heads, head_dim), compute)
    sinks = jnp.zeros(q_heads, jnp.float32)

    def step(q, k, pool, meta, sinks):
        return get_backend(name)(q, k, k, pool, 0, meta, sliding_window=128, sinks=sinks, logit_softcap=30.0,
                                 interpret=False)

    traced = jax.jit(step, donate_argnums=2).trace(q, k, pool, meta, sinks)
    if platform == "tpu":
        with jax.sharding.use_abstract_mesh(_TPU_MESH):
            lowered = traced.lower(lowering_platforms=("tpu",))
        assert "tpu_custom_call" in lowered.as_text()
    else:
        lowered = traced.lower(lowering_platforms=("cuda",))
        assert "triton" in lowered.as_text()


@pytest.mark.parametrize(("platform", "kernel"), [("tpu", "pallas_tpu"), ("gpu", "pallas_gpu")])
def test_auto_picks_the_platform_kernel(platform, kernel):
    choice = resolve_attention_backend("auto", platform, available_backends())
    assert (choice.backend, choice.fallback) == (kernel, False) and kernel in choice.message
    on_cpu = resolve_attention_backend("auto", "cpu", available_backends()).backend
    assert on_cpu == best_backend("cpu", available_backends()) and not on_cpu.startswith("pallas")
