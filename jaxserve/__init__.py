"""jaxserve: LLM serving in JAX/XLA. `jaxserve.Engine` is imported on first use, so `import jaxserve` stays
cheap (no JAX import)."""


def __getattr__(name: str):
    if name == "Engine":
        from jaxserve.api import Engine

        return Engine
    if name == "ServerArgs":
        from jaxserve.engine.config import ServerArgs

        return ServerArgs
    raise AttributeError(f"module 'jaxserve' has no attribute {name!r}")


__all__ = ["Engine", "ServerArgs"]
