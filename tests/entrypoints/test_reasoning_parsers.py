"""Reasoning parsers: whole replies and every streamed split agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pagedrs.entrypoints.openai.reasoning import get_reasoning_parser

CASES = [
    ("deepseek_r1", "Let me think.</think>The answer is 4.", "Let me think.", "The answer is 4."),
    ("deepseek_r1", "<think>Hmm <b>.</think>\n4", "Hmm <b>.", "\n4"),
    ("deepseek_r1", "still thinking <", "still thinking <", None),
    ("deepseek_r1", "</think>4", None, "4"),
    ("qwen3", "<think>a < b</think>yes", "a < b", "yes"),
    ("qwen3", "plain answer <t", None, "plain answer <t"),
    ("qwen3", "<think>unfinished", "unfinished", None),
]


@pytest.mark.parametrize(("parser", "reply", "reasoning", "content"), CASES)
def test_extract(parser: str, reply: str, reasoning: str | None, content: str | None) -> None:
    out = get_reasoning_parser(parser).extract(reply)
    assert (out.reasoning, out.content) == (reasoning, content)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize(("parser", "reply", "reasoning", "content"), CASES)
def test_streamed(
    parser: str, reply: str, reasoning: str | None, content: str | None, data: st.DataObject
) -> None:
    cuts = sorted(data.draw(st.sets(st.integers(1, len(reply) - 1), max_size=len(reply))))
    stream = get_reasoning_parser(parser).stream()
    bounds = list(zip([0, *cuts], [*cuts, len(reply)], strict=True))
    parts = [stream.feed(reply[a:b]) for a, b in bounds] + [stream.finish()]
    got_r = "".join(p.reasoning or "" for p in parts) or None
    got_c = "".join(p.content or "" for p in parts) or None
    if parser == "qwen3" and reasoning is not None and not reply.startswith("<think>"):
        pytest.skip("qwen3 streams a reply without <think> as answer")
    assert (got_r, got_c) == (reasoning, content)
    assert stream.reasoning_ended == (
        content is not None or parser == "qwen3" and reasoning is None
    )


def test_unknown() -> None:
    with pytest.raises(ValueError, match="reasoning_parser 'x'"):
        get_reasoning_parser("x")


def _accepts(matcher: Any, tokenizer: Any, text: str) -> bool:
    return all(matcher.accept_token(t) for t in tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("parser", ["deepseek_r1", "qwen3"])
def test_structured_outputs_after_reasoning(parser: str, default_model_dir: Path) -> None:
    """``constrain_answer``: the grammar starts after ``</think>``. The
    reasoning is any text without ``</think>`` (JSON-looking text included),
    the answer must match the schema, and the reply ends only once the answer
    is complete; qwen3's reply may also be the answer alone, deepseek_r1's not
    (its template opened the think block). What the parser returns as content
    is the constrained answer."""
    import xgrammar as xgr
    from pagedrs.sampling_params import StructuredOutputsParams
    from pagedrs.structured_output import GrammarSpec
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    reasoning = get_reasoning_parser(parser)
    params = reasoning.constrain_answer(StructuredOutputsParams(json=schema))
    assert params.reasoning_end == "</think>"
    assert params.reasoning_optional is (parser == "qwen3")
    info = xgr.TokenizerInfo.from_huggingface(tok, stop_token_ids=[tok.eos_token_id])
    compiled = xgr.GrammarCompiler(info).compile_grammar(GrammarSpec.from_params(params).build())

    reply = 'So {"n": "x"} </thin k> is not it; n is 3.</think>{"n": 3}'
    m = xgr.GrammarMatcher(compiled)
    assert _accepts(m, tok, reply) and m.accept_token(tok.eos_token_id) and m.is_terminated()
    split = reasoning.extract(reply)
    assert split.content == '{"n": 3}' and split.reasoning is not None

    m = xgr.GrammarMatcher(compiled)
    assert _accepts(m, tok, "thinking {")
    assert not m.accept_token(tok.eos_token_id)  # still reasoning: no end yet
    m = xgr.GrammarMatcher(compiled)
    assert _accepts(m, tok, "ok</think>")
    assert not _accepts(m, tok, '{"m": 1}')  # the answer is held to the schema

    m = xgr.GrammarMatcher(compiled)
    alone = _accepts(m, tok, '{"n": 7}') and m.accept_token(tok.eos_token_id)
    assert alone is (parser == "qwen3")
    if alone:
        assert reasoning.extract('{"n": 7}').content == '{"n": 7}'


def test_reasoning_fields_are_server_set() -> None:
    """``reasoning_end`` is not a request field of ``structured_outputs``, and
    ``reasoning_optional`` needs it."""
    from pagedrs.engine.core.errors import InvalidRequestError
    from pagedrs.sampling_params import StructuredOutputsParams

    with pytest.raises(InvalidRequestError, match="reasoning_optional"):
        StructuredOutputsParams(json_object=True, reasoning_optional=True)
    with pytest.raises(InvalidRequestError, match="reasoning_end"):
        StructuredOutputsParams(json_object=True, reasoning_end="")
