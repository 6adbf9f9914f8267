"""Run by test_tensor_parallel_speculative.py in a subprocess with 8 fake CPU devices (XLA_FLAGS set before
JAX starts): EAGLE-3 speculative decoding under tensor parallelism. For each target (a tiny Llama, a tiny
Qwen3 (q/k norms) and a tiny gpt-oss with SWA, sinks and MoE, all with 8 q heads and 2 kv heads, so tp 4
and 8 replicate kv heads), greedy outputs of the speculative engine with the radix cache on equal the tp 1
plain engine's, for chain and tree drafting spread over tp 2, 4 and 8 (`RUNS`; tp 1 speculative is the
lossless tests' case). The draft's parameters, pool and state are replicated on
every device while the target's pools hold 1/tp per device, i.e. max(1, kv_heads / tp) kv heads' worth;
each program compiles once (one bucket).
With --grid it runs the whole acceptance grid instead: chain and tree at tp 2, 4 and 8 for every target, and
gpt-oss's 4 experts at ep_size 1, 2 and 4 where ep divides tp (28 engines; by hand, not in CI).
Usage: python tests/speculative/tp_spec_check.py WORKDIR [--grid] ARCH..."""

import faulthandler
import os
import sys
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax

from jaxserve.api import Engine
from jaxserve.engine.step_input import Buckets
from jaxserve.loader.load import load_model
from tests.engine.conftest import GPT_OSS
from tests.models.helpers import make_hf_checkpoint
from tests.speculative import spec_pairs as sp

HEADS = dict(num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True, initializer_range=0.1)
ARCHS = {"llama": dict(num_hidden_layers=3, head_dim=8, **HEADS),
         # init 0.05: at 0.1 the copy draft (the first aux layer's hidden state read through the embedding)
         # had 1 proposal accepted over the run; at 0.05 about half, so both accept and reject paths run
         "qwen3": dict(num_hidden_layers=3, head_dim=16, **{**HEADS, "initializer_range": 0.05}),
         "gpt_oss": dict({**GPT_OSS, "num_hidden_layers": 4}, **HEADS)}
CONFIGS = {"chain": dict(speculative_num_steps=3),
           "tree": dict(speculative_num_steps=3, speculative_eagle_topk=2, speculative_num_draft_tokens=4)}
# (drafting, tp) per target: 5 speculative engines instead of 27 for the whole grid (each costs ~10 s of
# compiles on CPU). Llama and gpt-oss run both kinds at tp 4 and 8 (kv heads replicated); Qwen3 runs
# chain at tp 2, the one tp where each device holds its own kv head with no replication
RUNS = {"llama": (("chain", 4), ("tree", 8)), "qwen3": (("chain", 2),),
        "gpt_oss": (("tree", 4), ("chain", 8))}
GRID = tuple((name, tp) for tp in (2, 4, 8) for name in ("chain", "tree"))
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
PAGE_SIZE = 4


def engine(path: str, tp: int, ep: int | None = None, **spec) -> Engine:
    """One bucket per dimension: every step runs a program compiled on this thread."""
    return Engine(model_path=path, tp_size=tp, ep_size=ep, page_size=PAGE_SIZE, max_total_tokens=512,
                  chunked_prefill_size=32, max_running_requests=4, context_length=48,
                  buckets=Buckets((32,), (4,), (16,)), **spec)


def outputs(eng: Engine, prompts) -> list[list[int]]:
    """Greedy outputs over two passes (the second shares prefixes with the first: radix cache hits)."""
    outs = eng.generate(input_ids=prompts[:3], sampling_params=GREEDY)
    outs += eng.generate(input_ids=prompts[3:], sampling_params=GREEDY)
    assert sum(o["meta_info"]["cached_tokens"] for o in outs[3:]) > 0
    return [o["output_ids"] for o in outs]


def device_bytes(tree, device) -> int:
    leaves = jax.tree.leaves(tree)
    return sum(s.data.nbytes for a in leaves for s in a.addressable_shards if s.device == device)


def check(workdir: str, arch: str, grid: bool = False) -> None:
    path = os.path.join(workdir, arch)
    make_hf_checkpoint(path, arch, seed=1, **ARCHS[arch])
    draft = sp.copy_draft(load_model(path, progress=False, aux_hidden_state_layer_ids=sp.AUX))
    prompts = sp.shared_prefix_prompts(seed=5, n=6)
    plain = engine(path, 1)
    ref = outputs(plain, prompts)
    kv_heads = ARCHS[arch]["num_key_value_heads"]
    head_bytes = sum(a.nbytes for a in jax.tree.leaves(plain.kv.pools)) // kv_heads  # one kv head's pools
    runs = [(name, tp, ep) for name, tp in (GRID if grid else RUNS[arch])
            for ep in ((1, 2, 4)[:tp.bit_length()] if grid and arch == "gpt_oss" else (None,))]
    for name, tp, ep in runs:
        spec = dict(draft_model=draft, speculative_algorithm="EAGLE3", speculative_policy="always",
                    **CONFIGS[name])
        t0 = time.perf_counter()
        eng = engine(path, tp, ep, **spec)
        # engines over equal model graphs (same tp, another ep) share their programs, so count this one's
        before = eng.stepper.num_compiles
        out = outputs(eng, prompts)
        assert out == ref, (arch, name, tp, out, ref)
        stepper = eng.stepper
        assert stepper.stats["accepted"] > 0, stepper.stats
        # one bucket per dimension: a second executable of a program would be a recompile
        added = {k: n - before[k] for k, n in stepper.num_compiles.items()}
        assert max(added.values()) == 1, added
        eng.check_memory()
        dev = eng.mesh.devices.flat[0]
        draft_side = (stepper.dparams, stepper.dpool, stepper.states)
        assert all(a.sharding.is_fully_replicated for a in jax.tree.leaves(draft_side))
        assert device_bytes(draft_side, dev) == sum(a.nbytes for a in jax.tree.leaves(draft_side))
        pools = jax.tree.leaves(eng.kv.pools)
        assert device_bytes(pools, dev) * tp == sum(a.nbytes for a in pools)
        # as SGLang: each device holds max(1, kv_heads / tp) kv heads (a replicated head past tp = kv_heads)
        assert device_bytes(pools, dev) == head_bytes * max(1, kv_heads // tp)
        print(f"OK {arch} {name} tp={tp} ep={ep} kv_heads={eng.kv.layout.num_kv_heads} "
              f"accepted={stepper.stats['accepted']} compiles={added} "
              f"seconds={time.perf_counter() - t0:.1f}", flush=True)

if __name__ == "__main__":
    faulthandler.enable()  # a native abort still prints every thread's Python stack
    grid = "--grid" in sys.argv[2:]
    for name in (a for a in sys.argv[2:] if a != "--grid"):
        check(sys.argv[1], name, grid)
