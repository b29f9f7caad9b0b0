"""Session engines of the speculative decoding tests (``spec_engines``):
without speculation, ngram and suffix, each drafting every proposal in full."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pagedrs import LLM
from spec_engines import NGRAM, SUFFIX, engine


@pytest.fixture(scope="session")
def off() -> Iterator[LLM]:
    llm = engine()
    yield llm
    llm.llm_engine.shutdown()


@pytest.fixture(scope="session")
def ngram() -> Iterator[LLM]:
    llm = engine(NGRAM)
    yield llm
    llm.llm_engine.shutdown()


@pytest.fixture(scope="session")
def suffix() -> Iterator[LLM]:
    llm = engine(SUFFIX)
    yield llm
    llm.llm_engine.shutdown()
