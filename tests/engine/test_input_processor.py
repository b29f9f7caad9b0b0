"""One input processor for every front end: a prompt is validated once per
front-end call (offline ``LLM``, ``LLMEngine``, ``AsyncLLM`` on a thread and
in its own process), and what it refuses never reaches the core."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pagedrs import LLM, EngineArgs, SamplingParams
from pagedrs.engine import input_processor, validation
from pagedrs.engine.async_llm import AsyncLLM
from pagedrs.engine.core.errors import InvalidRequestError
from pagedrs.sampling_params import BeamSearchParams

PROMPT = [1, 450, 7483, 310, 3444, 338]
GREEDY = SamplingParams(max_tokens=4, temperature=0.0)


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The prompt lengths ``validation.check_prompt`` saw, wherever it is called from."""
    seen: list[int] = []
    real = validation.check_prompt

    def counted(ids: Any, *args: Any, **kwargs: Any) -> None:
        seen.append(len(ids))
        real(ids, *args, **kwargs)

    monkeypatch.setattr(validation, "check_prompt", counted)
    monkeypatch.setattr(input_processor, "check_prompt", counted)
    yield seen


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path) -> Iterator[LLM]:
    llm = LLM(str(tiny_model_dir), max_model_len=256)
    yield llm
    llm.shutdown()


def test_offline_front_ends_validate_each_prompt_once(llm: LLM, checks: list[int]) -> None:
    outs = llm.generate([PROMPT, "Hello there"], GREEDY, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [4, 4]
    assert checks == [len(PROMPT), len(outs[1].prompt_token_ids)]
    checks.clear()
    llm.beam_search([PROMPT], BeamSearchParams(beam_width=2, max_tokens=3), use_tqdm=False)
    assert checks == [len(PROMPT)]
    checks.clear()
    out = llm.chat([{"role": "user", "content": "Hi"}], GREEDY, use_tqdm=False)[0]
    assert checks == [len(out.prompt_token_ids)]
    checks.clear()
    engine = llm.llm_engine
    engine.add_request("one", PROMPT, GREEDY)
    while engine.has_unfinished_requests():
        engine.step()
    assert checks == [len(PROMPT)]


def test_refused_prompt_never_reaches_the_core(llm: LLM) -> None:
    vocab = llm.llm_engine.input_processor.vocab_size
    with pytest.raises(InvalidRequestError, match="at position 1") as info:
        llm.generate([[1, vocab]], GREEDY, use_tqdm=False)
    assert info.value.param == "prompt"
    with pytest.raises(ValueError, match="prompt 1: the prompt is empty"):
        llm.generate([PROMPT, []], GREEDY, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    assert llm.llm_engine.engine_core.registry.request_ids() == []


@pytest.mark.parametrize("engine_core_process", [False, True], ids=["thread", "process"])
def test_async_front_end_validates_each_prompt_once(
    tiny_model_dir: Path, checks: list[int], engine_core_process: bool
) -> None:
    engine = AsyncLLM(
        EngineArgs(model=str(tiny_model_dir), max_model_len=256),
        torch_threads=1,
        engine_core_process=engine_core_process,
    )

    async def run() -> list[int]:
        final = None
        async for out in engine.generate(PROMPT, GREEDY, "r"):
            final = out
        assert final is not None
        return final.outputs[0].token_ids

    try:
        tokens = asyncio.run(run())
        assert len(tokens) == 4
        assert checks == [len(PROMPT)]
        checks.clear()

        async def refused() -> None:
            async for _ in engine.generate([], GREEDY, "empty"):
                pass

        with pytest.raises(InvalidRequestError, match="empty"):
            asyncio.run(refused())
        assert checks == [0]
    finally:
        engine.shutdown()
