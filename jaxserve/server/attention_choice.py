"""`--attention-backend NAME`: SGLang's backend names mapped onto the attention backends jaxserve has here.

People paste SGLang command lines (`--attention-backend triton`, `fa3`, `flashinfer`, `torch_native`, ...).
Those name CUDA/ROCm kernel libraries that do not exist in a JAX process, so each is read as a request for
"the fastest kernel family of that kind" and mapped onto ours:

- a GPU kernel family (`triton`, `fa3`, `flashinfer`, ...) on a GPU: our best GPU backend (the Pallas GPU
  kernel once registered, else the XLA backend, else the native reference);
- `fa` (sglang-jax's TPU flash attention) on a TPU: our best TPU backend;
- `torch_native` (SGLang's plain-torch reference): our plain-JAX reference, `native`;
- `intel_amx` (a CPU kernel) on a CPU: our best CPU backend.
- Anything asked for on a platform where it cannot run (`fa3` or `triton` on a CPU, a `pallas_tpu` kernel on
  a GPU, `ascend` anywhere) falls back to our best backend for this platform with a warning: the server
  still starts, and the line says what runs instead.
Our own registered names are used as they are; `auto` is our best backend for this platform (the Pallas
kernel on a TPU or GPU, `_BEST` below on a CPU). An unknown name (neither ours nor SGLang's) is an error,
since it is almost always a typo.

The choice is a pure function of the name, the platform (`jax.default_backend()`) and the backends
registered in `jaxserve.layers.backends`; the launcher prints its `message` once at start-up.
"""

from __future__ import annotations

import dataclasses

# Preference per platform: the first one registered wins (on each, the engine's own `auto` choice first).
_BEST: dict[str, tuple[str, ...]] = {
    "tpu": ("pallas_tpu", "xla", "native"),
    "gpu": ("pallas_gpu", "xla", "native"),
    "cpu": ("xla", "native"),
}
AUTO = "auto"  # the best registered backend of the platform
# Our backends that run on one platform only.
_PLATFORM_ONLY = {"pallas_tpu": "tpu", "pallas_gpu": "gpu"}
# SGLang's names: (platform where the kernel family exists, or None for "anywhere"; what it is).
SGLANG_BACKENDS: dict[str, tuple[str | None, str]] = {
    "triton": ("gpu", "Triton GPU kernels"),
    "fa3": ("gpu", "FlashAttention-3 (CUDA)"),
    "fa4": ("gpu", "FlashAttention-4 (CUDA)"),
    "flashinfer": ("gpu", "FlashInfer (CUDA)"),
    "flashmla": ("gpu", "FlashMLA (CUDA)"),
    "cutlass_mla": ("gpu", "CUTLASS MLA (CUDA)"),
    "trtllm_mha": ("gpu", "TensorRT-LLM MHA (CUDA)"),
    "trtllm_mla": ("gpu", "TensorRT-LLM MLA (CUDA)"),
    "aiter": ("gpu", "AITER (ROCm)"),
    "wave": ("gpu", "Wave (ROCm)"),
    "flex_attention": ("gpu", "torch flex attention"),
    "dual_chunk_flash_attn": ("gpu", "dual-chunk FlashAttention (CUDA)"),
    "fa": ("tpu", "sglang-jax's TPU flash attention"),
    "intel_amx": ("cpu", "Intel AMX CPU kernels"),
    "ascend": ("npu", "Ascend NPU kernels"),
    "torch_native": (None, "the plain-torch reference"),
}


@dataclasses.dataclass(frozen=True)
class BackendChoice:
    """What `--attention-backend requested` resolved to: `backend` (a registered jaxserve backend), the
    `platform` it was chosen for, one line for the log, and whether that line is a warning (the request
    could not be honoured here and we fell back)."""

    requested: str
    backend: str
    platform: str
    message: str
    fallback: bool


def registered_backends() -> list[str]:
    from jaxserve.layers.backends import available_backends

    return available_backends()


def known_backend_names() -> list[str]:
    """Every name `--attention-backend` accepts: ours (registered or platform kernels) and SGLang's."""
    return sorted({AUTO, *registered_backends(), *_PLATFORM_ONLY, *SGLANG_BACKENDS})


def current_platform() -> str:
    """`cpu`, `gpu` or `tpu`: the platform of JAX's default device (ROCm and CUDA both count as gpu)."""
    import jax

    platform = jax.default_backend()
    return "gpu" if platform in ("cuda", "rocm", "gpu") else platform


def best_backend(platform: str, registered: list[str]) -> str:
    """The preferred registered backend for `platform` (unknown platforms get the CPU order)."""
    for name in _BEST.get(platform, _BEST["cpu"]):
        if name in registered:
            return name
    raise ValueError(f"no attention backend registered (have {registered})")


def resolve_attention_backend(requested: str, platform: str | None = None,
                              registered: list[str] | None = None) -> BackendChoice:
    """Map `requested` onto a registered backend for `platform` (default: this process's); ValueError for
    a name that is neither ours nor SGLang's."""
    platform = current_platform() if platform is None else platform
    registered = registered_backends() if registered is None else registered
    best = best_backend(platform, registered)
    name = requested.strip().lower().replace("-", "_")

    def choice(backend: str, message: str, fallback: bool = False) -> BackendChoice:
        return BackendChoice(requested, backend, platform, message, fallback)

    if name == AUTO:
        return choice(best, f"attention backend: auto -> {best}, jaxserve's best backend on {platform}")
    if name in registered and _PLATFORM_ONLY.get(name, platform) == platform:
        return choice(name, f"attention backend: {name} on {platform}")
    if name in _PLATFORM_ONLY or name in registered:
        where = _PLATFORM_ONLY.get(name)
        why = f"runs on {where} only" if where and where != platform else "is not available in this build"
        return choice(best, f"--attention-backend {requested}: {why}; using {best} on {platform} instead",
                      fallback=True)
    if name not in SGLANG_BACKENDS:
        ours = ", ".join([AUTO, *registered])
        raise ValueError(f"--attention-backend {requested}: unknown name; ours: {ours}; "
                         f"SGLang's (mapped onto ours): {', '.join(sorted(SGLANG_BACKENDS))}")
    where, what = SGLANG_BACKENDS[name]
    if name == "torch_native":
        backend = "native" if "native" in registered else best
        return choice(backend, f"attention backend: {requested} ({what}) -> {backend}, jaxserve's "
                               f"plain-JAX reference, on {platform}")
    if where == platform:
        return choice(best, f"attention backend: {requested} ({what}) -> {best}, jaxserve's best "
                            f"backend on {platform}")
    return choice(best, f"--attention-backend {requested}: {what} cannot run on {platform}; using {best}, "
                        f"jaxserve's best backend on {platform}", fallback=True)
