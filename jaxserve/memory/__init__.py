"""KV memory: donated device pools, the device page table, and host allocators with immutable states.

Modules, one concept each:
- `kv_pool`: `KVPool` layout `[layers, (num_pages + 1) * page_size, 2 * kv_heads, head_dim]`, K/V interleaved,
  storage dtypes (bf16 as uint16 bits, fp8 as uint8 bits + scale); `hybrid_pool`: full + SWA groups;
  `ops`: `write_kv` / `read_kv` / `write_kv_all_layers` for either, and their donated jitted versions.
- `page_table`: request -> page ids table (device) with donated row updates, and the host `RowAllocator`.
- `allocator` (token / paged), `extend` (alloc_extend / alloc_decode), `swa_allocator`: pure functions on
  immutable states; `page_stack` explains why old states stay valid; `facade`: the mutable holders that
  implement `cache.allocator.SlotAllocator` / `SWASlotAllocator`.
"""

from jaxserve.memory import allocator, extend, swa_allocator
from jaxserve.memory.allocator import AllocatorState, make_allocator, make_token_allocator
from jaxserve.memory.errors import (
    AllocatorError,
    DoubleFreeError,
    InvalidAllocRequestError,
    KVLayoutError,
    OutOfSlots,
    OutOfSlotsError,
    SlotRangeError,
    StaleAllocatorStateError,
)
from jaxserve.memory.eviction import evict_shortfall
from jaxserve.memory.facade import AllocatorFacade, SWAAllocatorFacade
from jaxserve.memory.hybrid_pool import HybridKVPool, HybridSlots, hybrid_pool_sizes, make_hybrid_kv_pool
from jaxserve.memory.kv_pool import STORAGE_DTYPES, KVPool, make_kv_pool
from jaxserve.memory.ops import (
    move_kv_donated,
    read_kv,
    read_kv_jit,
    write_kv,
    write_kv_all_layers,
    write_kv_all_layers_donated,
    write_kv_donated,
    write_kv_hybrid_donated,
)
from jaxserve.memory.page_table import (
    RowAllocator,
    clear_rows,
    clear_rows_donated,
    make_page_table,
    pages_to_slots,
    set_row_spans,
    set_row_spans_donated,
    set_rows,
    set_rows_donated,
)
from jaxserve.memory.swa_allocator import SWAAllocatorState, make_swa_allocator

__all__ = [
    "STORAGE_DTYPES",
    "AllocatorError",
    "AllocatorFacade",
    "AllocatorState",
    "DoubleFreeError",
    "HybridKVPool",
    "HybridSlots",
    "InvalidAllocRequestError",
    "KVLayoutError",
    "KVPool",
    "OutOfSlots",
    "OutOfSlotsError",
    "RowAllocator",
    "SWAAllocatorFacade",
    "SWAAllocatorState",
    "SlotRangeError",
    "StaleAllocatorStateError",
    "allocator",
    "clear_rows",
    "clear_rows_donated",
    "evict_shortfall",
    "extend",
    "hybrid_pool_sizes",
    "make_allocator",
    "make_hybrid_kv_pool",
    "make_kv_pool",
    "make_page_table",
    "make_swa_allocator",
    "make_token_allocator",
    "move_kv_donated",
    "pages_to_slots",
    "read_kv",
    "read_kv_jit",
    "set_row_spans",
    "set_row_spans_donated",
    "set_rows",
    "set_rows_donated",
    "swa_allocator",
    "write_kv",
    "write_kv_all_layers",
    "write_kv_all_layers_donated",
    "write_kv_donated",
    "write_kv_hybrid_donated",
]
