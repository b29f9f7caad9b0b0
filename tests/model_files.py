"""The tests' GGUF files, looked up at run time in pagedrs' cache
(``$PAGEDRS_CACHE``, default ``~/.cache/pagedrs``; ``model_registry``) and
fetched there when absent. CI fetches them before pytest starts
(``pagedrs download --all`` in ``.ci/run``); under ``CI=true`` a file that is
still missing fails the test instead of skipping it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pagedrs.executor.model_registry import (
    GEMMA3_GGUF,
    SMOLLM2_GGUF,
    fetch_gguf_file,
    gguf_path,
)

__all__ = ["GEMMA3_GGUF", "SMOLLM2_GGUF", "gguf_file"]


def in_ci() -> bool:
    """``CI=true`` (or 1/yes), as CI services set it."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def gguf_file(name: str) -> Path:
    """Path of the GGUF file ``name`` (``model_registry.GGUF_FILES``), fetched
    into the cache if absent. When it cannot be fetched: a failure under
    ``CI=true``, elsewhere a skip naming the file, the folder and the error."""
    path = gguf_path(name)
    if path.exists():
        return path
    try:
        return fetch_gguf_file(name)
    except RuntimeError as e:
        why = f"model file {name} not in {path.parent} and not fetched ({e})"
        if in_ci():
            pytest.fail(f"{why}; CI runs `pagedrs download --all` before pytest")
        pytest.skip(f"missing model file: {why}")
