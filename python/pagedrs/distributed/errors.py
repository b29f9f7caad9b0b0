"""Errors of the tensor-parallel executor."""

from __future__ import annotations


class WorkerDiedError(RuntimeError):
    """A tensor-parallel worker process exited; the engine cannot go on."""
