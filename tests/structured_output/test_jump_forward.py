"""Jump-forward decoding (``StructuredOutputsParams.jump_forward``): the text
a grammar forces joins the output as the tokenizer's own tokens of it. The
runs ``CanonicalTokens`` gives are checked against the tokenizer's encoding
of whole texts; on the default model, outputs stay in their grammar, forced
tokens have logprob 0, ``max_tokens`` cuts a run, and a grammar that forces
everything after the first token gives the tokenizer's tokens of the text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pagedrs import LLM, SamplingParams
from pagedrs.sampling_params import StructuredOutputsParams as SO
from pagedrs.structured_output.jump_forward import CanonicalTokens
from transformers import AutoTokenizer

CALLS = [
    '<tool_call>\n{"name": "lookup", "arguments": {"term": "Paris"}}\n</tool_call>',
    '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}\n</tool_call>',
    '{"city": "S\u00e3o Paulo", "unit": "celsius"}',
]
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(default_model_dir)


@pytest.fixture(scope="module")
def llm(default_model_dir: Path) -> LLM:
    return LLM(str(default_model_dir), max_model_len=512)


def _encode(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("text", CALLS)
def test_runs_are_the_tokenizers_tokens_of_the_whole_text(tokenizer: Any, text: str) -> None:
    """Every split of a text into context, a first token (each of the
    tokenizer's tokens there, and the one-character token) and forced text:
    a run, when given, is a run of the whole text's own tokens, starting at
    the first token's text, and leaves out at most the last pre-token."""
    canonical = CanonicalTokens(tokenizer)
    assert canonical.enabled
    whole = _encode(tokenizer, text)
    starts = [len(tokenizer.decode(whole[:i])) for i in range(len(whole) + 1)]
    num_runs = 0
    for i in range(1, len(whole)):
        if "\ufffd" in tokenizer.decode(whole[: i + 1]):
            continue  # inside a character's UTF-8 bytes
        at = starts[i]
        firsts = {whole[i]}
        one_char = _encode(tokenizer, text[at])
        if len(one_char) == 1:
            firsts.add(one_char[0])
        for first in firsts:
            first_text = tokenizer.decode([first])
            forced = text[at + len(first_text) :]
            for ends in (False, True):
                run = canonical.tokens(whole[:i], first, forced, ends)
                if run is None:
                    continue
                num_runs += 1
                assert whole[i : i + len(run)] == run, (text[:at], first_text, ends)
                covered = len(tokenizer.decode(run))
                assert covered > len(first_text)
                if ends:
                    assert i + len(run) == len(whole)
                else:
                    last = tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)[-1]
                    assert at + covered <= last[1][0]
    assert num_runs >= len(whole) // 2


def test_runs_refused_where_the_tokenizer_has_no_boundary(tokenizer: Any) -> None:
    canonical = CanonicalTokens(tokenizer)
    ctx = _encode(tokenizer, '{"city": "Par')
    (token,) = _encode(tokenizer, "is")
    assert _encode(tokenizer, '{"city": "Paris') != [*ctx, token]  # "Paris" is one token
    assert canonical.tokens(ctx, token, '", "unit": "', False) is None
    # A token that ends inside a character (UTF-8 bytes of "\u00e3") gives no run.
    partial = [t for t in _encode(tokenizer, "\u00e3") if "\ufffd" in tokenizer.decode([t])]
    if partial:
        assert canonical.tokens(ctx, partial[0], "o", False) is None
    # The last pre-token is left to the model unless only stop tokens follow.
    ctx = _encode(tokenizer, '{"name": "')
    (first,) = _encode(tokenizer, "l")
    run = canonical.tokens(ctx, first, 'ookup", "arguments": {"term": "', False)
    assert run == _encode(tokenizer, 'lookup", "arguments": {"term":')
    run = canonical.tokens(ctx, first, 'ookup", "arguments": {"term": "', True)
    assert run == _encode(tokenizer, 'lookup", "arguments": {"term": "')


def _chat(llm: LLM, question: str) -> str:
    msgs = [{"role": "user", "content": question}]
    return llm.get_tokenizer().apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def test_forced_choice_is_the_tokenizers_tokens_with_logprob_zero(llm: LLM) -> None:
    """A choice whose first token decides the rest: the output's tokens are
    the tokenizer's tokens of its text (then EOS), the forced ones with
    logprob 0 and no other entry; without jumps the text is one of the
    choices too."""
    tok = llm.get_tokenizer()
    names = ["get_weather_in_a_city", "lookup_a_term"]
    prompt = _chat(llm, "Which function tells the weather?")
    for seed in range(3):
        jf = SamplingParams(
            temperature=1.0,
            seed=seed,
            max_tokens=32,
            logprobs=2,
            structured_outputs=SO(choice=names, jump_forward=True),
        )
        out = llm.generate([prompt], jf, use_tqdm=False)[0].outputs[0]
        assert out.text in names and out.finish_reason == "stop"
        ids = list(out.token_ids)
        assert ids[:-1] == _encode(tok, out.text)
        assert out.logprobs is not None and len(out.logprobs) == len(ids)
        for lp in out.logprobs[1:-1]:  # forced: after the first token, before EOS
            (entry,) = lp.values()
            assert entry.logprob == 0.0
    plain = SamplingParams(temperature=0.0, max_tokens=32, structured_outputs=SO(choice=names))
    assert llm.generate([prompt], plain, use_tqdm=False)[0].outputs[0].text in names


def test_max_tokens_cuts_a_forced_run(llm: LLM) -> None:
    names = ["get_weather_in_a_city", "lookup_a_term"]
    so = SO(choice=names, jump_forward=True)
    params = SamplingParams(temperature=0.0, max_tokens=3, structured_outputs=so)
    out = llm.generate([_chat(llm, "Weather?")], params, use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 3
    assert any(n.startswith(out.text) for n in names)


def test_json_schema_outputs_validate_with_jumps(llm: LLM) -> None:
    """Sampled JSON with jumps parses and validates; the object's keys, forced
    text, are the tokenizer's tokens of the output there."""
    tok = llm.get_tokenizer()
    so = SO(json=WEATHER, disable_any_whitespace=True, jump_forward=True)
    params = SamplingParams(temperature=1.0, n=3, seed=7, max_tokens=48, structured_outputs=so)
    prompt = _chat(llm, "The weather in Paris as JSON.")
    for out in llm.generate([prompt], params, use_tqdm=False)[0].outputs:
        if out.finish_reason != "stop":
            continue
        jsonschema.validate(json.loads(out.text), WEATHER)
        keys = _encode(tok, '{"city":')  # then ' "', which a string's text may extend
        assert list(out.token_ids[: len(keys)]) == keys
