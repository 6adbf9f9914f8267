"""Checkpoint loading errors; each message names the tensor, file or config field at fault."""

from __future__ import annotations


class CheckpointError(ValueError):
    """Base class: the checkpoint cannot be loaded into the model."""


class MissingTensorError(CheckpointError):
    """A tensor the model needs is not in any checkpoint file."""


class UnexpectedTensorError(CheckpointError):
    """The checkpoint has tensors the model would silently ignore (usually a config/weights mismatch)."""


class ShapeMismatchError(CheckpointError):
    """A tensor's shape differs from the parameter it is loaded into."""


class CorruptCheckpointError(CheckpointError):
    """A safetensors file or index cannot be parsed."""
