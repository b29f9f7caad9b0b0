"""vLLM's offline API surface: LLM.chat options, pagedrs.inputs prompts, SamplingParams.clone."""

from __future__ import annotations

from pathlib import Path

import pagedrs
import pytest
from pagedrs import LLM, SamplingParams
from pagedrs.inputs import TextPrompt, TokensPrompt

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)
MSGS = [{"role": "user", "content": "Name three rivers."}]
# A template that renders its tools and an extra variable, unlike the tokenizer's own.
TOOLS_TEMPLATE = (
    "{% if tools %}[tools:{% for t in tools %}{{ t['function']['name'] }};{% endfor %}]{% endif %}"
    "{% if greeting is defined %}{{ greeting }}|{% endif %}"
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path) -> LLM:
    return LLM(str(tiny_model_dir), max_model_len=256)


def _ids(tok: object, **kwargs: object) -> list[int]:
    """Token ids of what HF's apply_chat_template renders, no extra special tokens."""
    text = tok.apply_chat_template(tokenize=False, **kwargs)  # type: ignore[attr-defined]
    return tok(text, add_special_tokens=False).input_ids  # type: ignore[operator]


def test_chat_template_override(llm: LLM) -> None:
    tok = llm.get_tokenizer()
    assert tok.chat_template  # the tiny model carries the default model's template
    out = llm.chat(MSGS, GREEDY, use_tqdm=False, chat_template=TOOLS_TEMPLATE)[0]
    assert out.prompt == "<user>Name three rivers.</user><assistant>"
    assert out.prompt_token_ids == _ids(
        tok, conversation=MSGS, chat_template=TOOLS_TEMPLATE, add_generation_prompt=True
    )
    default = llm.chat(MSGS, GREEDY, use_tqdm=False)[0]
    assert default.prompt_token_ids == _ids(tok, conversation=MSGS, add_generation_prompt=True)
    assert default.prompt_token_ids != out.prompt_token_ids


def test_tools_and_template_kwargs_pass_through(llm: LLM) -> None:
    tok = llm.get_tokenizer()
    out = llm.chat(
        MSGS,
        GREEDY,
        use_tqdm=False,
        chat_template=TOOLS_TEMPLATE,
        tools=TOOLS,
        chat_template_kwargs={"greeting": "hey"},
    )[0]
    assert out.prompt == "[tools:get_weather;]hey|<user>Name three rivers.</user><assistant>"
    assert out.prompt_token_ids == _ids(
        tok,
        conversation=MSGS,
        chat_template=TOOLS_TEMPLATE,
        tools=TOOLS,
        greeting="hey",
        add_generation_prompt=True,
    )
    # The tokenizer's own template ignores tools: the prompt is what HF renders.
    plain = llm.chat(MSGS, GREEDY, use_tqdm=False, tools=TOOLS)[0]
    assert plain.prompt_token_ids == _ids(
        tok, conversation=MSGS, tools=TOOLS, add_generation_prompt=True
    )


def test_continue_final_message(llm: LLM) -> None:
    tok = llm.get_tokenizer()
    conv = [*MSGS, {"role": "assistant", "content": "The Nile, the"}]
    out = llm.chat(
        conv, GREEDY, use_tqdm=False, add_generation_prompt=False, continue_final_message=True
    )[0]
    assert out.prompt is not None and out.prompt.endswith("The Nile, the")
    assert out.prompt_token_ids == _ids(
        tok, conversation=conv, add_generation_prompt=False, continue_final_message=True
    )
    with pytest.raises(ValueError, match="continue_final_message"):
        llm.chat(conv, GREEDY, use_tqdm=False, continue_final_message=True)


def test_chat_per_conversation_params(llm: LLM) -> None:
    convs = [MSGS, [{"role": "user", "content": "Hi"}]]
    outs = llm.chat(
        convs,
        [
            SamplingParams(temperature=0.0, max_tokens=3),
            SamplingParams(temperature=0.0, max_tokens=5),
        ],
        use_tqdm=False,
    )
    assert [len(o.outputs[0].token_ids) for o in outs] == [3, 5]
    with pytest.raises(ValueError, match="sampling params"):
        llm.chat(convs, [GREEDY], use_tqdm=False)


def test_prompt_typeddicts_match_plain_prompts(llm: LLM) -> None:
    assert pagedrs.TokensPrompt is TokensPrompt and pagedrs.TextPrompt is TextPrompt
    text = "The capital of France is"
    ids = llm.get_tokenizer()(text).input_ids
    plain = llm.generate([text, ids], GREEDY, use_tqdm=False)
    typed = llm.generate(
        [TextPrompt(prompt=text), TokensPrompt(prompt_token_ids=ids)], GREEDY, use_tqdm=False
    )
    for a, b in zip(plain, typed, strict=True):
        assert a.prompt == b.prompt and a.prompt_token_ids == b.prompt_token_ids
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
    single = llm.generate(TokensPrompt(prompt_token_ids=ids), GREEDY, use_tqdm=False)
    assert single[0].outputs[0].token_ids == plain[1].outputs[0].token_ids
    salted = llm.generate(TextPrompt(prompt=text, cache_salt="s"), GREEDY, use_tqdm=False)
    assert salted[0].outputs[0].token_ids == plain[0].outputs[0].token_ids


def test_sampling_params_clone_is_independent() -> None:
    p = SamplingParams(temperature=0.5, stop=["x"], stop_token_ids=[7], seed=3)
    c = p.clone()
    assert c == p and c is not p
    c.stop.append("y")  # type: ignore[union-attr]
    c.stop_token_ids.append(8)
    c.temperature = 0.1
    assert p.stop == ["x"] and p.stop_token_ids == [7] and p.temperature == 0.5
