"""Both executors implement the one ``Executor`` interface the engine drives,
with the same signatures, so neither can drift from it unnoticed."""

import inspect

import pytest
from pagedrs.distributed.tp_runner import TensorParallelRunner
from pagedrs.executor.interface import Executor
from pagedrs.executor.model_runner import ModelRunner

MEMBERS = ("kv_cache_spec", "apply_block_moves", "execute", "close")


def _params(fn: object) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", [ModelRunner, TensorParallelRunner])
def test_executor_members_and_signatures(cls: type) -> None:
    for name in MEMBERS:
        want, got = getattr(Executor, name), getattr(cls, name, None)
        assert got is not None, f"{cls.__name__} lacks {name}"
        if isinstance(want, property):
            assert isinstance(got, property), f"{cls.__name__}.{name} must be a property"
            continue
        required = [
            p
            for p, v in inspect.signature(got).parameters.items()
            if p != "self" and v.default is inspect.Parameter.empty
        ]
        assert _params(got)[: len(_params(want))] == _params(want), name
        assert set(required) <= set(_params(want)), f"{cls.__name__}.{name} needs more arguments"


def test_engine_runner_is_an_executor(tiny_model_dir) -> None:
    from pagedrs import LLM

    llm = LLM(str(tiny_model_dir), max_model_len=64)
    assert isinstance(llm.llm_engine.engine_core.runner, Executor)
