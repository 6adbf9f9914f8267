"""Shared neural-network layers: written once, reused by every model in `jaxserve.models`."""
