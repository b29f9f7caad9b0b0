"""A stop token, a stop string or max_tokens that falls inside an accepted run
of drafts cuts the run there, as decoding without speculation stops there."""

from __future__ import annotations

from typing import Any

from pagedrs import LLM, SamplingParams
from spec_engines import PROMPTS


def _runs(llm: LLM, prompt: str, params: SamplingParams) -> tuple[list[int], list[int]]:
    """The request's output tokens and the size of each step's run."""
    eng = llm.llm_engine
    eng.add_request("runs", prompt, params)
    sizes, tokens = [], []
    while eng.has_unfinished_requests():
        for out in eng.step():
            new = list(out.outputs[0].token_ids)
            if len(new) > len(tokens):
                sizes.append(len(new) - len(tokens))
                tokens = new
    return tokens, sizes


def _inside_run(tokens: list[int], sizes: list[int], tokenizer: Any) -> int:
    """A position strictly inside a run of several tokens whose token (and
    text) does not occur earlier in the output."""
    start = 0
    for size in sizes:
        for p in range(start, start + size - 1):
            text = tokenizer.decode([tokens[p]])
            earlier = tokenizer.decode(tokens[:p])
            if tokens[p] not in tokens[:p] and text.strip() and text not in earlier:
                return p
        start += size
    raise AssertionError(f"no run of several new tokens (runs {sizes})")


def _one(llm: LLM, params: SamplingParams) -> tuple[Any, ...]:
    c = llm.generate([PROMPTS[0]], params, use_tqdm=False)[0].outputs[0]
    lps = [{t: lp.logprob for t, lp in pos.items()} for pos in c.logprobs or []]
    return list(c.token_ids), c.text, c.finish_reason, c.stop_reason, lps, c.cumulative_logprob


def test_stop_token_string_and_max_tokens_inside_a_run(ngram: LLM, off: LLM) -> None:
    base = SamplingParams(max_tokens=32, temperature=0.0)
    tokens, sizes = _runs(ngram, PROMPTS[0], base)
    p = _inside_run(tokens, sizes, ngram.get_tokenizer())
    text = ngram.get_tokenizer().decode([tokens[p]])
    cases = [
        SamplingParams(max_tokens=32, temperature=0.0, stop_token_ids=[tokens[p]], logprobs=1),
        SamplingParams(max_tokens=32, temperature=0.0, stop=[text], logprobs=1),
        SamplingParams(
            max_tokens=32, temperature=0.0, stop=[text], include_stop_str_in_output=True
        ),
        SamplingParams(max_tokens=p + 1, temperature=0.0, logprobs=0),
    ]
    for params in cases:
        got, want = _one(ngram, params), _one(off, params)
        assert got == want, params
        assert len(got[0]) <= p + 1
    assert _one(off, cases[0])[2:4] == ("stop", tokens[p])
    assert _one(off, cases[3])[2] == "length"
    assert ngram.llm_engine.kv_cache_stats()["num_used_blocks"] == 0
