"""jaxserve: LLM serving in JAX/XLA. `jaxserve.Engine` is imported on first use, so `import jaxserve` stays
cheap (no JAX import)."""


def __getattr__(name: str):
    if name in ("Engine", "ServerArgs"):
        from jaxserve import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'jaxserve' has no attribute {name!r}")


__all__ = ["Engine", "ServerArgs"]
