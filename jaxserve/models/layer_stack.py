"""Decoder layers stacked along a leading axis and run as one `jax.lax.scan`, so compile time does not grow
with depth.

A stack has a `period` p: layer i has the same structure (graph: attention kind, window, rotary table, MLP
kind) as layer i % p; the first `p * num_blocks` layers are stacked (`num_blocks = num_layers // p`), the
`num_layers % p` left over run unrolled after the scan. Homogeneous models (Llama, Qwen3) have p = 1;
alternating sliding/full models (gpt-oss, Gemma 2) p = 2; Gemma 3's 5 sliding + 1 full p = 6. For each
offset j < p the parameters of the stacked layers j, j + p, j + 2p, ... are stacked into one array per leaf
(`[num_blocks, ...]`), and the scan runs over blocks: one iteration applies the p layers of a block.

KV pools stay copy-free: the pools are the scan *carry* (each layer writes its K/V at a traced layer index,
then reads), never `xs`/`ys` - a pool passed through `xs` or returned as `ys` is copied whole every layer.
Layer l of a block b sits at index `base_j + stride_j * b` of its pool group (`route_block`), which holds
for any pool whose groups list layers in order (`KVLayout.make_pools`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxserve.layers.attention_metadata import AttentionMetadata
from jaxserve.models.kv_layout import KVPools, group_pool, replace_group, route_layer

LayerFn = Callable[..., tuple[jax.Array, KVPools]]


def apply_layer(layer: nnx.Module, x: jax.Array, meta: AttentionMetadata, pools: KVPools,
                layer_id: int) -> tuple[jax.Array, KVPools]:
    """One decoder layer on `x [T, hidden]`, writing and reading model layer `layer_id` (a Python int) in
    the pool group that holds it; returns the new residual and pools."""
    group, index = route_layer(pools, layer_id)
    x, pool = layer(x, meta, group_pool(pools, group), index, use_swa_tables=group == "swa")
    return x, replace_group(pools, group, pool)


def layer_period(layers: Sequence[nnx.Module]) -> int:
    """The smallest p such that every layer i has the graph (static structure and parameter shapes) of
    layer i % p; `len(layers)` when nothing shorter repeats. p need not divide the depth (Gemma 3: 26
    layers, period 6)."""
    graphs = [nnx.split(layer)[0] for layer in layers]
    n = len(graphs)
    for p in range(1, n + 1):
        if all(graphs[i] == graphs[i % p] for i in range(n)):
            return p
    return n


class LayerStack(nnx.Module):
    """`num_layers` layers as `period` stacked modules (`blocks[j]`: the layers j, j + p, ... of the first
    `num_blocks * period` layers, every parameter stacked on a new leading axis of size `num_blocks`), plus
    the `tail` of `num_layers % period` layers kept as they are (run unrolled after the scan).

    As a sequence it reads like the list it replaces: `stack[i]` is layer i (a stacked layer's parameters
    sliced out, a copy), `len(stack)` the number of layers. `run` applies all layers in order.
    """

    def __init__(self, layers: Sequence[nnx.Module], period: int):
        if not 1 <= period <= len(layers):
            raise ValueError(f"period {period} is not in [1, {len(layers)}]")
        self.period = period
        self.num_blocks = len(layers) // period
        stacked = self.num_blocks * period
        blocks = []
        for j in range(period):
            graph, _ = nnx.split(layers[j])
            states = [nnx.split(layer)[1] for layer in layers[j:stacked:period]]
            blocks.append(nnx.merge(graph, jax.tree.map(lambda *a: jnp.stack(a), *states)))
        self.blocks = nnx.List(blocks)
        self.tail = nnx.List(list(layers[stacked:]))

    def __len__(self) -> int:
        return self.period * self.num_blocks + len(self.tail)

    def __getitem__(self, layer: int) -> nnx.Module:
        if not -len(self) <= layer < len(self):
            raise IndexError(f"layer {layer} out of range for {len(self)} layers")
        layer %= len(self)
        if layer >= self.period * self.num_blocks:
            return self.tail[layer - self.period * self.num_blocks]
        graph, state = nnx.split(self.blocks[layer % self.period])
        return nnx.merge(graph, jax.tree.map(lambda a: a[layer // self.period], state))

    def __iter__(self) -> Iterator[nnx.Module]:
        return (self[i] for i in range(len(self)))

    def route_block(self, pools: KVPools) -> list[tuple[str, int, int]]:
        """Per offset j: `(group, base, stride)` so that layer `b * period + j` is index `base + stride * b`
        of pool group `group` for every block b; ValueError when `pools` does not route layers that way."""
        routes = []
        for j in range(self.period):
            group, base = route_layer(pools, j)
            stride = route_layer(pools, j + self.period)[1] - base if self.num_blocks > 1 else 0
            for b in range(self.num_blocks):
                if route_layer(pools, b * self.period + j) != (group, base + stride * b):
                    raise ValueError(f"the KV pools do not place layer {b * self.period + j} where a stack "
                                     f"of period {self.period} expects it")
            routes.append((group, base, stride))
        return routes

    def run(self, x: jax.Array, meta: AttentionMetadata, pools: KVPools, *,
            capture: Sequence[int] = ()) -> tuple[jax.Array, KVPools, dict[int, jax.Array]]:
        """Apply every layer to the residual stream `x [T, hidden]` (each writes its K/V into `pools`, then
        attends). Returns `(x, pools, captured)`, `captured[i]` the residual at the output of layer i for
        each i in `capture`."""
        routes = self.route_block(pools)
        graphs, states = zip(*(nnx.split(block) for block in self.blocks), strict=True)
        offsets = sorted({i % self.period for i in capture if i < self.period * self.num_blocks})

        def body(carry, xs):
            x, pools = carry
            b, block_states = xs
            outs = {}
            for j, ((group, base, stride), graph, state) in enumerate(zip(routes, graphs, block_states,
                                                                          strict=True)):
                layer = nnx.merge(graph, state)
                x, pool = layer(x, meta, group_pool(pools, group), base + stride * b,
                                use_swa_tables=group == "swa")
                pools = replace_group(pools, group, pool)
                if j in offsets:
                    outs[j] = x
            return (x, pools), outs

        xs = (jnp.arange(self.num_blocks, dtype=jnp.int32), tuple(states))
        (x, pools), outs = jax.lax.scan(body, (x, pools), xs)
        stacked = self.period * self.num_blocks
        captured = {i: outs[i % self.period][i // self.period] for i in capture if i < stacked}
        for i, layer in enumerate(self.tail, start=stacked):
            x, pools = apply_layer(layer, x, meta, pools, i)
            if i in capture:
                captured[i] = x
        return x, pools, captured
