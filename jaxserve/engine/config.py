"""`ServerArgs`: the engine's settings, with SGLang's names (`--page-size`, `--disable-radix-cache`, ...).

Units: `max_total_tokens` and `chunked_prefill_size` count token slots; `page_size` is slots per page.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Mapping
from typing import Any

from jaxserve.layers.backends import AUTO, DEFAULT_BACKEND, get_backend
from jaxserve.models.sharding import expert_parallel_sizes
from jaxserve.sampling.grammar import GRAMMAR_BACKENDS


@dataclasses.dataclass(frozen=True)
class ServerArgs:
    """Engine configuration. Unknown keyword arguments raise TypeError naming the supported ones.

    model_path: HF checkpoint directory (config.json + safetensors; tokenizer.json optional).
    page_size: KV slots per page (1 = token granular). max_total_tokens: KV pool size in slots (whole
    pages are used; page 0 is reserved on top). chunked_prefill_size: most tokens computed in one step
    (prefill chunks and decode tokens together); a longer prompt is prefilled over several steps.
    max_running_requests: most requests in a step (also the sequence bucket cap). context_length: longest
    prompt + output (default: the model's max_position_embeddings). disable_radix_cache: no prefix reuse.
    dtype: "auto" (checkpoint dtype), "float32", "bfloat16" or "float16" (parameters and KV pool).
    swa_full_tokens_ratio: SWA pool size relative to the full pool for hybrid sliding-window models.
    disable_overlap_schedule: when False (default), the host schedules and dispatches step t+1 before
    reading step t's sampled ids (fed to t+1 on device), so host work overlaps device work; a request that
    stops on EOS / a stop string then computes one wasted token. random_seed: base of the seeds given to
    requests without one. warmup: compile every bucket shape at
    start-up (tqdm progress bar). skip_tokenizer_init: input_ids only, no text. attention_backend: a name
    registered in `jaxserve.layers.backends`, or `auto` (default: the platform's best - the Pallas kernel on
    a TPU or GPU, `native` on a CPU; `xla` walks only the real context), used for the models the engine
    loads from `model_path` (a model passed in keeps the backend it was built with).
    speculative_algorithm: None, or "EAGLE3" (speculative decoding with an EAGLE-3 draft head, see
    `jaxserve.speculative.stepper`). speculative_draft_model_path:
    the head's checkpoint directory (SpecForge layout). speculative_num_steps: draft steps per round (the
    chain length). speculative_eagle_topk: branches per draft step (1 = chain). speculative_num_draft_tokens:
    tokens verified per round including the last known token (None: num_steps + 1 for a chain).
    grammar_backend: "llguidance" (default: json_schema / regex / ebnf sampling parameters constrain the
    output), "xgrammar" (SGLang's default library, an optional extra: `jaxserve[xgrammar]`) or "none" (such
    requests are refused).
    speculative_policy: "auto" (default: each decode step is an EAGLE-3 round or a plain step, whichever
    measured more tokens per second at the running batch size; below 4 decoding requests, rounds while the
    requests' own drafts are accepted, and always for a request that has run none yet; once plain steps
    win at a batch size, the requests decoding then drop their drafts and finish with plain steps. The
    choice from 4 requests on depends on timings, so a seeded sampled request is reproducible only when
    the same steps are chosen: "always" makes it so), "always" (a round every step, as SGLang) or "never"
    (plain steps only, the draft kept usable). speculative_disable_batch_size: decode plainly at this many
    decoding requests or more (a fixed threshold, under any policy; None: no threshold).
    tp_size: tensor-parallel degree: one SPMD program over a `("tp",)` mesh of the first tp_size devices,
    weights sharded per `jaxserve.models.sharding` (placed at load time), KV pools sharded on kv heads,
    attention per shard under shard_map; the host cache, allocators and scheduler stay single. With
    speculative decoding the EAGLE-3 draft is replicated on every device (`speculative.stepper`).
    ep_size: how MoE experts (gpt-oss) split over the same tp devices, a divisor of tp_size: tp_size
    (None, the default) gives each device tp_size-th of the experts, whole; 1 splits every expert's
    intermediate dimension across the devices instead; one between does both (ep_size groups of experts,
    each expert's intermediate dimension over the tp_size / ep_size devices of its group). Other values are
    refused (`models.sharding.expert_parallel_sizes`).
    mem_fraction_static: size the KV pools from device memory instead of `max_total_tokens` (SGLang's
    flag): weights and pools may take this fraction of the device, and the pools also leave the measured
    activation peak of the largest bucket free (`jaxserve.engine.memory_plan`); an explicit
    `max_total_tokens` still wins. None (default): `max_total_tokens` sizes the pool.
    disable_layer_scan: run the decoder layers as an unrolled Python loop inside the step instead of one
    `jax.lax.scan` over stacked layer parameters (`jaxserve.models.decoder.scan_layers`, the default:
    compile time does not grow with depth); same outputs, for comparison and debugging.
    dist_init_addr, nnodes, node_rank: multi-host serving (SGLang's flags, `jaxserve.engine.multihost`):
    with nnodes > 1 every process calls `jax.distributed.initialize` with the coordinator at
    dist_init_addr ("HOST:PORT", rank 0's host) and its own node_rank in [0, nnodes); the tp mesh then spans
    the devices of all processes (tp_size must equal the global device count). Rank 0 schedules (and
    serves HTTP); the other ranks follow its steps (`Engine.follow`). Not with speculative decoding,
    mem_fraction_static or constrained decoding (grammars) yet.
    debug_token_keys: debugging only. With speculative decoding, key the prefix tree by tokens instead of
    bigrams: the behaviour before the EAGLE cache fix, where a prefix hit serves draft KV that was computed
    with another request's next token (outputs stay lossless, acceptance drops). For measuring what bigram
    keys buy; never for serving.
    """

    model_path: str | None = None
    page_size: int = 1
    max_total_tokens: int = 8192
    chunked_prefill_size: int = 512
    max_running_requests: int = 32
    context_length: int | None = None
    disable_radix_cache: bool = False
    dtype: str = "auto"
    swa_full_tokens_ratio: float = 1.0
    disable_overlap_schedule: bool = False
    random_seed: int = 0
    warmup: bool = False
    skip_tokenizer_init: bool = False
    attention_backend: str = DEFAULT_BACKEND
    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None
    speculative_num_steps: int = 3
    speculative_eagle_topk: int = 1
    speculative_num_draft_tokens: int | None = None
    grammar_backend: str = "llguidance"
    speculative_policy: str = "auto"
    speculative_disable_batch_size: int | None = None
    tp_size: int = 1
    ep_size: int | None = None
    mem_fraction_static: float | None = None
    disable_layer_scan: bool = False
    debug_token_keys: bool = False
    dist_init_addr: str | None = None
    nnodes: int = 1
    node_rank: int = 0

    def __post_init__(self) -> None:
        positive = ("page_size", "max_total_tokens", "chunked_prefill_size", "max_running_requests")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"server arg {name}={value!r} must be an int >= 1")
        if self.max_total_tokens < self.page_size:
            raise ValueError(f"max_total_tokens={self.max_total_tokens} holds no page of {self.page_size}")
        if self.max_running_requests > self.chunked_prefill_size:
            raise ValueError(
                f"max_running_requests={self.max_running_requests} exceeds chunked_prefill_size="
                f"{self.chunked_prefill_size}: every running request needs a token of the step budget"
            )
        if self.context_length is not None and self.context_length < 2:
            raise ValueError(f"context_length={self.context_length} must be >= 2")
        if not 0 < self.swa_full_tokens_ratio <= 1:
            raise ValueError(f"swa_full_tokens_ratio={self.swa_full_tokens_ratio} must be in (0, 1]")
        if isinstance(self.tp_size, bool) or not isinstance(self.tp_size, int) or self.tp_size < 1:
            raise ValueError(f"server arg tp_size={self.tp_size!r} must be an int >= 1")
        if self.ep_size is not None and self.ep_size not in expert_parallel_sizes(self.tp_size):
            raise ValueError(f"ep_size={self.ep_size!r} with tp_size={self.tp_size}; choose one of "
                             f"{list(expert_parallel_sizes(self.tp_size))}")
        self._check_multihost()
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static < 1:
            raise ValueError(f"mem_fraction_static={self.mem_fraction_static} must be in (0, 1)")
        if self.speculative_algorithm is not None:
            self._check_speculative()
        if self.attention_backend != AUTO:  # auto resolves when a model first attends (platform known)
            get_backend(self.attention_backend)  # ValueError listing the registered names
        if self.grammar_backend not in GRAMMAR_BACKENDS:
            raise ValueError(f"grammar_backend={self.grammar_backend!r}; choose one of "
                             f"{', '.join(GRAMMAR_BACKENDS)}")
        if self.grammar_backend == "xgrammar" and importlib.util.find_spec("xgrammar") is None:
            raise ValueError("grammar_backend='xgrammar' needs the xgrammar package, an optional extra "
                             "that brings torch: pip install 'jaxserve[xgrammar]' (or use the default, "
                             "llguidance)")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype={self.dtype!r}; choose auto, float32, bfloat16 or float16")

    def _check_multihost(self) -> None:
        for name, low in (("nnodes", 1), ("node_rank", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"server arg {name}={value!r} must be an int >= {low}")
        if self.node_rank >= self.nnodes:
            raise ValueError(f"node_rank={self.node_rank} must be below nnodes={self.nnodes} (ranks are "
                             f"0 .. nnodes - 1)")
        if self.nnodes == 1:
            return
        if self.dist_init_addr is None:
            raise ValueError(f"nnodes={self.nnodes} needs dist_init_addr (--dist-init-addr HOST:PORT, the "
                             f"address of rank 0's host, the same on every node)")
        from jaxserve.engine.multihost import parse_addr

        parse_addr(self.dist_init_addr)
        if self.speculative_algorithm is not None:
            raise ValueError("nnodes > 1 with speculative decoding is not supported yet (EAGLE-3 runs on "
                             "one process only)")
        if self.mem_fraction_static is not None:
            raise ValueError("nnodes > 1 with mem_fraction_static is not supported yet (each process would "
                             "plan from its own free memory); size the pool with max_total_tokens")

    def _check_speculative(self) -> None:
        if self.speculative_algorithm.upper() not in ("EAGLE3", "EAGLE"):
            raise ValueError(f"speculative_algorithm={self.speculative_algorithm!r}; only EAGLE3 is "
                             f"supported")
        for name in ("speculative_num_steps", "speculative_eagle_topk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"server arg {name}={value!r} must be an int >= 1")
        if self.speculative_policy not in ("auto", "always", "never"):
            raise ValueError(f"speculative_policy={self.speculative_policy!r}; choose 'auto', 'always' or "
                             "'never'")
        if self.speculative_disable_batch_size is not None and self.speculative_disable_batch_size < 1:
            raise ValueError(f"speculative_disable_batch_size={self.speculative_disable_batch_size}: "
                             "give a batch size >= 1 (or leave it unset)")
        chain = self.speculative_num_steps + 1
        if self.speculative_eagle_topk == 1 and self.speculative_num_draft_tokens not in (None, chain):
            raise ValueError(f"speculative_num_draft_tokens={self.speculative_num_draft_tokens}: a chain "
                             f"(topk=1) verifies num_steps + 1 = {chain} tokens")
        if self.speculative_eagle_topk > 1:
            most = 1 + self.speculative_eagle_topk + (self.speculative_num_steps - 1) * \
                self.speculative_eagle_topk ** 2
            num = self.speculative_num_draft_tokens
            if num is None or not 2 <= num <= most:
                raise ValueError(f"tree drafting (topk={self.speculative_eagle_topk}) needs "
                                 f"speculative_num_draft_tokens in [2, {most}]")

    @property
    def num_draft_tokens(self) -> int:
        """Tokens verified per speculative round (the last known token + the drafts)."""
        return self.speculative_num_draft_tokens or self.speculative_num_steps + 1

    @property
    def num_pages(self) -> int:
        """Allocatable full pages (page 0 is reserved on top of these)."""
        return self.max_total_tokens // self.page_size

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> ServerArgs:
        """Build from keyword arguments; unknown names raise TypeError listing the supported ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown server arg(s) {unknown}; supported: {sorted(known)}")
        return cls(**kwargs)
