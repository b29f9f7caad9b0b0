"""``paused_gc``: automatic garbage collection off during an engine's
startup, restored after it, scopes nesting."""

from __future__ import annotations

import gc

import pytest
from pagedrs.engine.core.startup_gc import paused_gc


@pytest.fixture(autouse=True)
def restore_gc() -> object:
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_paused_then_restored_nested() -> None:
    gc.enable()
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_restored_after_an_error() -> None:
    gc.enable()
    with pytest.raises(RuntimeError), paused_gc():
        raise RuntimeError("load failed")
    assert gc.isenabled()


def test_left_off_when_it_was_off() -> None:
    gc.disable()
    with paused_gc():
        assert not gc.isenabled()
    assert not gc.isenabled()
