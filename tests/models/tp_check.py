"""Run by test_tensor_parallel.py in a subprocess with 8 fake CPU devices (XLA_FLAGS set before JAX starts):
tiny Llama / Qwen3 / gpt-oss checkpoints loaded with tensor-parallel placement (`models.sharding`) at tp
2 and 4 decode greedily the same tokens as the unsharded model; every shard holds 1/tp of each sharded
parameter and of the KV pools; the compiled sharded step keeps each pool shard in place with no collective
on it; `Engine(tp_size=tp)` gives the unsharded engine's greedy outputs. gpt-oss at tp 4 also runs ep 1 and
2 (`check_ep`: experts split on their intermediate dimension, and over 2 groups of 2 devices each).
Usage: python tests/models/tp_check.py WORKDIR ARCH..."""

import faulthandler
import os
import re
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata
from jaxserve.loader.load import load_model
from jaxserve.models.config import ModelConfig
from jaxserve.models.decoder import scan_layers
from jaxserve.models.sharding import (
    make_sharded_pools,
    make_tp_mesh,
    set_mesh,
    sharding_for,
    tp_layout,
)
from jaxserve.models.step import make_forward
from tests.models.helpers import make_hf_checkpoint

ARCHS = {
    "llama": {},
    "qwen3": {"head_dim": 16},
    "gpt_oss": dict(num_hidden_layers=4, head_dim=16, sliding_window=8, num_local_experts=4,
                    num_experts_per_tok=2, intermediate_size=64, swiglu_limit=1.5,
                    layer_types=["sliding_attention", "full_attention"] * 2),
}
PAGE_SIZE, NEW_TOKENS = 4, 8
PROMPTS = [np.random.RandomState(s).randint(0, 256, n).tolist() for s, n in ((0, 13), (1, 6))]


def greedy(model, layout, mesh) -> list[list[int]]:
    """Prefill both prompts in one step, then NEW_TOKENS greedy decode steps; page tables as the engine."""
    forward, params = make_forward(model)
    pages_each = -(-(max(map(len, PROMPTS)) + NEW_TOKENS) // PAGE_SIZE)
    if mesh is None:
        pools = layout.make_pools(2 * pages_each, PAGE_SIZE, np.float32)
    else:
        pools = make_sharded_pools(layout, mesh, 2 * pages_each, PAGE_SIZE, np.float32)
    pages = [list(range(1 + i * pages_each, 1 + (i + 1) * pages_each)) for i in range(2)]
    seqs = [list(p) for p in PROMPTS]
    new = [len(p) for p in PROMPTS]
    for _ in range(NEW_TOKENS):
        steps = [SequenceStep(n, len(s), pg, pg if layout.hybrid else None)
                 for n, s, pg in zip(new, seqs, pages, strict=True)]
        meta = build_attention_metadata(steps, page_size=PAGE_SIZE, with_swa=layout.hybrid,
                                        token_buckets=(32,), seq_buckets=(2,), page_buckets=(8,))
        ids = np.zeros(meta.num_tokens, np.int32)
        flat = [t for n, s in zip(new, seqs, strict=True) for t in s[len(s) - n:]]
        ids[: len(flat)] = flat
        logits, pools, _ = forward(params, ids, meta, pools)
        for s, t in zip(seqs, np.asarray(logits)[:2].argmax(-1), strict=True):
            s.append(int(t))
        new = [1, 1]
    return [s[len(p):] for s, p in zip(seqs, PROMPTS, strict=True)], pools


def engine_outputs(path: str, tp: int, **extra) -> list[list[int]]:
    """Greedy outputs of `Engine(model_path=path, tp_size=tp)` (radix cache on, chunked prefill), twice over
    the same prompts: the second pass hits the cached prefixes. Its one step bucket compiles once."""
    from jaxserve.api import Engine
    from jaxserve.engine.step_input import Buckets

    # one bucket: every step runs the program compiled on this thread (no padded fallback while a
    # background thread compiles; a run of this check under pytest once aborted in C++ with it)
    engine = Engine(model_path=path, tp_size=tp, page_size=4, max_total_tokens=512, chunked_prefill_size=16,
                    max_running_requests=2, context_length=64, buckets=Buckets((16,), (2,), (16,)), **extra)
    params = {"temperature": 0.0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
    # engines over the same model graph share their step programs (an earlier engine here may have
    # compiled one for other parameter shardings): count this engine's own
    before = engine.runner.num_compiles
    outs = [[o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=params)]
            for _ in range(2)]
    assert outs[0] == outs[1] and engine.kv.pools is not None
    # one bucket, at most one new executable: the pools a step returns select the program the fresh pools did
    assert engine.runner.num_compiles - before <= 1, (before, engine.runner.num_compiles)
    return outs[0]


def check_memory_plan(path: str, tp: int) -> None:
    """`Engine(tp_size=tp, mem_fraction_static=...)` with a fake 64 MiB device: the plan is per device and
    each device's share of the pools it built is the planned size."""
    import jaxserve.api as api

    real = api.device_memory
    api.device_memory = lambda: (64 << 20, 60 << 20)
    try:
        engine = api.Engine(model_path=path, tp_size=tp, mem_fraction_static=0.5, page_size=4,
                            chunked_prefill_size=16, max_running_requests=2)
    finally:
        api.device_memory = real
    plan, dev = engine.memory_plan, jax.devices()[0]
    assert plan.weight_bytes == per_device_bytes(jax.tree.leaves(engine.runner.params), dev)
    assert per_device_bytes(jax.tree.leaves(engine.kv.pools), dev) == plan.pool_bytes
    assert plan.pool_bytes <= (32 << 20) - plan.weight_bytes


def assert_pool_stays_local(model, layout, mesh) -> None:
    """The compiled sharded step writes and reads each shard's bf16 pool in place: no copy of a pool shard,
    no collective on a pool-shaped array."""

    before = jax.config.values["jax_disable_most_optimizations"]
    jax.config.update("jax_disable_most_optimizations", False)  # the HLO a server compiles (see conftest)
    forward, params = make_forward(model)
    pools = make_sharded_pools(layout, mesh, 16, PAGE_SIZE, jnp.bfloat16)
    pages = list(range(1, 9))
    steps = [SequenceStep(20, 20, pages, pages if layout.hybrid else None)]
    meta = build_attention_metadata(steps, page_size=PAGE_SIZE, with_swa=layout.hybrid, token_buckets=(32,),
                                    seq_buckets=(1,), page_buckets=(8,))
    hlo = forward.lower(params, np.zeros(meta.num_tokens, np.int32), meta, pools).compile().as_text()
    jax.config.update("jax_disable_most_optimizations", before)
    tp = mesh.shape["tp"]
    shapes = set()
    for a in jax.tree.leaves(pools):
        n, slots, heads, d = a.shape
        shapes.add(f"u16[{n},{slots},{heads // tp},{d}]")
    assert all(s in hlo for s in shapes), shapes
    bad = [ln for ln in hlo.splitlines() if any(s in ln for s in shapes)
           and re.search(r"copy\(|all-gather|all-reduce|all-to-all|collective-permute", ln)]
    assert not bad, bad[:3]


def check_ep(path: str, ref, layout, mesh, engine_ref, ep: int) -> None:
    """`ep_size=ep` below tp: experts split into ep groups, each expert's intermediate dimension into tp/ep
    (ep 1: every device holds all experts with 1/tp of their intermediate columns/rows; 1 < ep < tp: E/ep
    experts with 1/(tp/ep) of those). Each device holds 1/tp of gate_up_proj, its bias and down_proj,
    down_proj's bias is replicated, the MoE layer all-reduces only [tokens, hidden] arrays, and the greedy
    tokens are the unsharded model's, through the forward and the engine."""
    tp = mesh.shape["tp"]
    inner = tp // ep
    config = ModelConfig.from_file(path)
    place = sharding_for(config, mesh, ep_size=ep)
    model = set_mesh(load_model(path, progress=False, sharding_for=place), mesh)
    dev = mesh.devices.flat[0]
    for layer in model.layers:
        mlp = layer.mlp
        for name in ("gate_up_proj", "gate_up_proj_bias", "down_proj"):
            a = getattr(mlp, name)[...]
            shards = {s.data.shape for s in a.addressable_shards}
            assert shards == {(a.shape[0] // ep, *a.shape[1:-1], a.shape[-1] // inner) if name != "down_proj"
                              else (a.shape[0] // ep, a.shape[1] // inner, a.shape[2])}, (name, shards)
            assert per_device_bytes([a], dev) * tp == a.nbytes, name
        assert mlp.down_proj_bias[...].sharding.is_fully_replicated
    assert_moe_reduces_tokens_by_hidden(model.layers[0].mlp, mesh)
    out, _ = greedy(scan_layers(model), layout, mesh)
    assert out == ref, ("ep", ep, tp, out, ref)
    assert engine_outputs(path, tp, ep_size=ep) == engine_ref


def assert_moe_reduces_tokens_by_hidden(mlp, mesh, tokens: int = 8) -> None:
    """The compiled sharded MoE layer on `tokens` tokens: every all-reduce is of a [tokens, hidden] array
    (never of per-expert outputs [tokens, experts, hidden]), and there is at least one."""
    graph, state = nnx.split(mlp)
    hidden = mlp.down_proj.shape[-1]
    x = jax.device_put(jnp.ones((tokens, hidden), jnp.float32), NamedSharding(mesh, P()))
    hlo = jax.jit(lambda st, x: nnx.merge(graph, st)(x)).lower(state, x).compile().as_text()
    results = [re.findall(r"\w+\[[\d,]*\]", ln.split(" all-reduce(")[0].split(" = ")[-1])
               for ln in hlo.splitlines() if " all-reduce(" in ln]
    assert results, "no all-reduce"
    assert all(shapes and set(shapes) == {f"f32[{tokens},{hidden}]"} for shapes in results), results


def per_device_bytes(arrays, device) -> int:
    return sum(s.data.nbytes for a in arrays for s in a.addressable_shards if s.device == device)


def check(workdir: str, arch: str) -> None:
    path = os.path.join(workdir, arch)
    make_hf_checkpoint(path, arch, seed=3, **ARCHS[arch])
    ref_model = load_model(path, progress=False)
    ref, _ = greedy(ref_model, ref_model.kv_layout, None)
    config = ref_model.config
    engine_ref = engine_outputs(path, 1)
    assert engine_ref == ref, (engine_ref, ref)
    for tp in (2, 4):  # tp 1 is the unsharded reference itself (`--tp-size 1` builds no mesh)
        mesh = make_tp_mesh(tp)
        model = set_mesh(load_model(path, progress=False, sharding_for=sharding_for(config, mesh)), mesh)
        leaves = jax.tree.leaves(nnx.state(model))
        sharded = [a for a in leaves if not a.sharding.is_fully_replicated]
        replicated = [a for a in leaves if a.sharding.is_fully_replicated]
        dev = mesh.devices.flat[0]
        assert sharded, "nothing sharded"
        assert per_device_bytes(sharded, dev) * tp == sum(a.nbytes for a in sharded)
        assert per_device_bytes(replicated, dev) == sum(a.nbytes for a in replicated)
        layout = tp_layout(model.kv_layout, tp)
        for scanned in (False, True):
            out, pools = greedy(scan_layers(model) if scanned else model, layout, mesh)
            assert out == ref, (arch, tp, scanned, out, ref)
            if scanned:  # stacking keeps each parameter's sharding
                stacked = jax.tree.leaves(nnx.state(scan_layers(model)))
                assert per_device_bytes(stacked, dev) == per_device_bytes(leaves, dev)
        data = jax.tree.leaves(pools)
        assert per_device_bytes(data, dev) * tp == sum(a.nbytes for a in data)
        assert_pool_stays_local(scan_layers(model), layout, mesh)
        assert engine_outputs(path, tp) == engine_ref
        if arch == "llama":
            check_memory_plan(path, tp)
        if config.num_local_experts and tp == 4:
            for ep in (1, 2):
                check_ep(path, ref, layout, mesh, engine_ref, ep)
        heads = layout.num_kv_heads
        print(f"OK {arch} tp={tp} kv_heads={heads} weights/device={per_device_bytes(leaves, dev)} "
              f"pool/device={per_device_bytes(data, dev)}", flush=True)


if __name__ == "__main__":
    faulthandler.enable()  # a native abort still prints every thread's Python stack
    for name in sys.argv[2:]:
        check(sys.argv[1], name)
