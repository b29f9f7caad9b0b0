"""Every core operation reaches the server's engine core in its own process
through the core client: beam search (``use_beam_search`` on
``/v1/completions``) gives the offline engine's beams, and
``POST /reset_prefix_cache`` empties the prefix cache between steps."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pagedrs import LLM, EngineArgs
from pagedrs.engine.async_llm import AsyncLLM
from pagedrs.entrypoints.openai.api_server import build_app
from pagedrs.sampling_params import BeamSearchParams
from server_utils import ServerThread, all_blocks_free, torch_threads, wait_for

MODEL = "tiny"
# Long enough to fill several 16-token blocks of the prefix cache.
PROMPT = "The quick brown fox jumps over the lazy dog. " * 6


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerThread]:
    engine = AsyncLLM(EngineArgs(model=str(tiny_model_dir), max_model_len=256), torch_threads=1)
    assert engine.core_pid is not None  # the core runs in its own process
    app = build_app(engine, [MODEL])
    with torch_threads(1), ServerThread(app) as srv:
        yield srv


def _complete(server: ServerThread, **body: object) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, **body}, timeout=120)


def test_beam_search_over_the_core_process_matches_offline(
    server: ServerThread, tiny_model_dir: Path
) -> None:
    params = BeamSearchParams(beam_width=3, max_tokens=8, length_penalty=0.5)
    llm = LLM(str(tiny_model_dir), max_model_len=256)
    try:
        want = llm.beam_search([PROMPT], params, use_tqdm=False)[0]
    finally:
        llm.shutdown()
    r = _complete(
        server, prompt=PROMPT, n=3, max_tokens=8, use_beam_search=True, length_penalty=0.5
    )
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["text"] for c in choices] == [c.text for c in want.outputs]
    assert [c["index"] for c in choices] == list(range(len(want.outputs)))
    assert r.json()["usage"]["completion_tokens"] == sum(len(c.token_ids) for c in want.outputs)
    wait_for(lambda: all_blocks_free(server.url), what="every beam's blocks freed")


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"stream": True}, "stream"), ({"logprobs": 1}, "logprobs"), ({"best_of": 4}, "best_of")],
)
def test_beam_search_refuses_what_it_cannot_do(
    server: ServerThread, extra: dict[str, object], param: str
) -> None:
    r = _complete(server, prompt=PROMPT, n=2, max_tokens=4, use_beam_search=True, **extra)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param


def test_reset_prefix_cache_over_the_core_process(server: ServerThread) -> None:
    def cached_tokens() -> int:
        r = _complete(server, prompt=PROMPT, max_tokens=2, temperature=0)
        assert r.status_code == 200, r.text
        details = r.json()["usage"].get("prompt_tokens_details") or {}
        return int(details.get("cached_tokens") or 0)

    cached_tokens()
    assert cached_tokens() >= 16  # the second run finds the first one's full blocks
    wait_for(lambda: all_blocks_free(server.url), what="requests finished")
    r = httpx.post(f"{server.url}/reset_prefix_cache", timeout=30)
    assert r.status_code == 200 and r.json() == {"reset": True}
    assert cached_tokens() == 0  # nothing cached survived the reset
