"""`ArgLayout`: how the arguments of a `runner.Programs` call reach its executable, with the host's numpy
leaves packed into one flat buffer per dtype.

Each numpy leaf given to an executable is its own host-to-device transfer, and each costs the host a fixed
amount: on a 2-core CPU, 31 int32 leaves of 160 elements took 131 us of the calling thread per call,
against 28 us for one packed buffer, the concatenate included (on a GPU each leaf is also its own copy). A
decode step's inputs are 23 numpy leaves (token ids, attention metadata, sampling rows) and an EAGLE-3
round's 31, so the layout packs them: the host concatenates the leaves of each dtype into one buffer, and
the executable slices them back out (static offsets and shapes, which XLA turns into views) before it runs
the function. The buffers are 64-byte aligned (`memory.host_buffers`), so the CPU backend takes them without
a copy.

Argument positions are of three kinds:
- `fixed` (parameters: `Programs` keeps their leaves): a flat tuple of their leaves;
- donated: passed as they are, so the executable still consumes the caller's buffers;
- any other: a tuple of its device leaves and its large host leaves, its other host leaves (numpy arrays
  and scalars of at most `PACK_MAX_ELEMENTS` elements) going to the packed buffers in leaf order. A large
  leaf (a page table at a long context: 32 rows x 4,096 pages) costs more to copy into a buffer than its
  own transfer's fixed cost, and packing it would make the host's work grow with the context.
The layout is a function of the abstract arguments (which leaves are on the host, their shapes and dtypes),
so it is built once per executable and packing a call's leaves costs one concatenate per dtype.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import numpy as np

from jaxserve.memory.host_buffers import aligned_empty

FIXED, DONATED, SPLIT = "fixed", "donated", "split"
# host leaves up to this many elements are packed, larger ones go as they are. 16 KiB of int32 copies in
# well under one transfer's fixed cost (here ~3 us a leaf; 1 MiB of page tables took 36 us to pack), and
# the cap keeps the copy from growing with the context
PACK_MAX_ELEMENTS = 4096


@dataclasses.dataclass(frozen=True)
class ArgLayout:
    """Per argument position: its kind, its pytree structure, the indices of the leaves passed as they are
    (device leaves and large host leaves) and, for each packed host leaf, (leaf index, buffer, offset,
    shape) in the packed buffers (`dtypes[buffer]`, `sizes` elements each)."""

    kinds: tuple[str, ...]
    trees: tuple[Any, ...]
    device: tuple[tuple[int, ...], ...]
    host: tuple[tuple[tuple[int, int, int, tuple[int, ...]], ...], ...]
    dtypes: tuple[np.dtype, ...]
    sizes: tuple[int, ...]

    @classmethod
    def of(cls, specs: tuple, *, fixed: tuple[int, ...], donated: tuple[int, ...]) -> ArgLayout:
        """The layout for arguments shaped as `specs` (leaves `jax.ShapeDtypeStruct`; a leaf without a
        sharding is a host leaf). `fixed` and `donated`: argument positions."""
        kinds, trees, device, host = [], [], [], []
        buffer_of: dict[np.dtype, int] = {}
        sizes: list[int] = []
        for i, arg in enumerate(specs):
            leaves, tree = jax.tree.flatten(arg)
            trees.append(tree)
            kind = FIXED if i in fixed else DONATED if i in donated else SPLIT
            kinds.append(kind)
            dev, packed = [], []
            if kind == SPLIT:
                for j, leaf in enumerate(leaves):
                    size = math.prod(leaf.shape)
                    if getattr(leaf, "sharding", None) is not None or size > PACK_MAX_ELEMENTS:
                        dev.append(j)
                        continue
                    dtype = np.dtype(leaf.dtype)
                    b = buffer_of.setdefault(dtype, len(buffer_of))
                    if b == len(sizes):
                        sizes.append(0)
                    shape = tuple(leaf.shape)
                    packed.append((j, b, sizes[b], shape))
                    sizes[b] += size
            device.append(tuple(dev))
            host.append(tuple(packed))
        return cls(tuple(kinds), tuple(trees), tuple(device), tuple(host), tuple(buffer_of), tuple(sizes))

    def flat_specs(self, specs: tuple) -> tuple:
        """The executable's abstract arguments for arguments shaped as `specs` (what `pack` gives)."""
        out = []
        for i, kind in enumerate(self.kinds):
            if kind == DONATED:
                out.append(specs[i])
                continue
            leaves = jax.tree.leaves(specs[i])
            out.append(tuple(leaves) if kind == FIXED else tuple(leaves[j] for j in self.device[i]))
        buffers = tuple(jax.ShapeDtypeStruct((n,), d) for d, n in zip(self.dtypes, self.sizes, strict=True))
        return (*out, buffers)

    def pack(self, args: tuple, leaves: list) -> tuple:
        """A call's executable arguments: `args` as given, `leaves[i]` the leaves of `args[i]` (read for
        fixed and split positions)."""
        out = [args[i] if kind == DONATED else leaves[i] if kind == FIXED
               else tuple(leaves[i][j] for j in dev)
               for i, (kind, dev) in enumerate(zip(self.kinds, self.device, strict=True))]
        out.append(tuple(np.concatenate([leaves[i][j] for i, j in group], axis=None,
                                        out=aligned_empty(size, dtype))
                         for group, size, dtype in zip(self._gather, self.sizes, self.dtypes, strict=True)))
        return tuple(out)

    @functools.cached_property
    def _gather(self) -> tuple[tuple[tuple[int, int], ...], ...]:
        """Per packed buffer, the (position, leaf index) of its leaves in buffer order."""
        groups: list[list[tuple[int, int]]] = [[] for _ in self.dtypes]
        for i, packed in enumerate(self.host):
            for j, b, _, _ in packed:
                groups[b].append((i, j))
        return tuple(tuple(g) for g in groups)

    def unpack(self, flat: tuple) -> tuple:
        """Inside the executable's trace: the function's arguments from `pack`'s (the inverse of `pack`)."""
        *positions, buffers = flat
        args = []
        for i, (kind, x) in enumerate(zip(self.kinds, positions, strict=True)):
            if kind == DONATED:
                args.append(x)
                continue
            if kind == FIXED:
                args.append(jax.tree.unflatten(self.trees[i], x))
                continue
            leaves: list = [None] * self.trees[i].num_leaves
            for j, leaf in zip(self.device[i], x, strict=True):
                leaves[j] = leaf
            for j, b, offset, shape in self.host[i]:
                leaves[j] = buffers[b][offset: offset + math.prod(shape)].reshape(shape)
            args.append(jax.tree.unflatten(self.trees[i], leaves))
        return tuple(args)
