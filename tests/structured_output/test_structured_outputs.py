"""Structured outputs on the default model: JSON schemas, regexes, choices, EBNF
grammars and JSON objects give outputs that parse and validate, greedy and sampled
with n > 1; bad specs fail at add; the step's bitmask equals xgrammar's own
per-token answer; matchers go with their requests; grammar requests leave the
others' outputs as they were, and survive preemption."""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import msgspec
import numpy as np
import pytest
import torch
import xgrammar as xgr
from pagedrs import LLM, BeamSearchParams, SamplingParams
from pagedrs.sampling_params import StructuredOutputsParams as SO
from pagedrs.structured_output import GrammarSpec, StepBitmask, apply_bitmask

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 2},
    },
    "required": ["name", "age", "pets"],
}
PHONE = r"\d{3}-\d{3}-\d{4}"
COLORS = ["red", "green", "blue"]
EBNF = 'root ::= "The answer is " [0-9]+ "."'
PLAIN = ["The capital of France is", "def fib(n):", "1 2 3 4 5 6 7"]


@pytest.fixture(scope="module")
def llm(default_model_dir: Path) -> LLM:
    # Batch-invariant projections: outputs alone and in a mixed batch, preempted
    # or not, are compared token for token, which holds only with equal bits.
    return LLM(str(default_model_dir), max_model_len=512, batch_invariant=True)


def chat(llm: LLM, question: str) -> str:
    tok = llm.get_tokenizer()
    msgs = [{"role": "user", "content": question}]
    return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def greedy(so: SO, max_tokens: int = 48, **kw: object) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, structured_outputs=so, **kw)


def sampled(so: SO, n: int, seed: int, max_tokens: int = 48) -> SamplingParams:
    return SamplingParams(
        temperature=1.0, n=n, seed=seed, max_tokens=max_tokens, structured_outputs=so
    )


def test_every_kind_greedy_and_sampled(llm: LLM) -> None:
    compact = SO(json=PERSON, disable_any_whitespace=True)
    cases = [
        ("Describe a person as JSON.", greedy(SO(json=PERSON))),
        ("Describe a person as JSON.", sampled(compact, n=3, seed=1, max_tokens=64)),
        ("Give me a phone number.", greedy(SO(regex=PHONE))),
        ("Give me a phone number.", sampled(SO(regex=PHONE), n=2, seed=2)),
        ("What is your favourite color?", greedy(SO(choice=COLORS))),
        ("What is your favourite color?", sampled(SO(choice=COLORS), n=3, seed=3)),
        ("What is 2 + 2?", greedy(SO(grammar=EBNF), max_tokens=16)),
        ("What is 2 + 2?", sampled(SO(grammar=EBNF), n=2, seed=4, max_tokens=16)),
        ('Reply with a JSON object with one key "name".', greedy(SO(json_object=True))),
    ]
    outs = llm.generate([chat(llm, q) for q, _ in cases], [p for _, p in cases], use_tqdm=False)
    eos = llm.llm_engine.engine_core.eos_token_ids
    for (_, params), out in zip(cases, outs, strict=True):
        assert len(out.outputs) == params.n
        so = params.structured_outputs
        assert so is not None
        for c in out.outputs:
            assert c.finish_reason == "stop" and c.stop_reason is None, (so, c)
            assert c.token_ids[-1] in eos
            if so.json is not None:
                jsonschema.validate(json.loads(c.text), PERSON)
            elif so.json_object:
                assert isinstance(json.loads(c.text), dict)
            elif so.regex is not None:
                assert re.fullmatch(PHONE, c.text), c.text
            elif so.choice is not None:
                assert c.text in COLORS
            else:
                assert re.fullmatch(r"The answer is [0-9]+\.", c.text), c.text
    assert len(llm.llm_engine.engine_core.structured) == 0


def test_chat_with_a_schema(llm: LLM) -> None:
    msgs = [{"role": "user", "content": "Describe a person as JSON."}]
    out = llm.chat(msgs, greedy(SO(json=json.dumps(PERSON))), use_tqdm=False)[0].outputs[0]
    jsonschema.validate(json.loads(out.text), PERSON)


def test_grammar_ends_the_sequence_with_ignore_eos_min_tokens_and_logprobs(llm: LLM) -> None:
    prompt = chat(llm, "What is your favourite color?")
    params = [
        greedy(SO(choice=COLORS), ignore_eos=True),
        greedy(SO(choice=COLORS), min_tokens=20),  # the grammar's end wins
        greedy(SO(choice=COLORS), logprobs=2, repetition_penalty=1.3),
    ]
    outs = llm.generate([prompt] * 3, params, use_tqdm=False)
    texts = {o.outputs[0].text for o in outs}
    assert len(texts) <= 2 and texts <= set(COLORS)
    for o in outs:
        c = o.outputs[0]
        assert (
            c.finish_reason == "stop"
            and c.token_ids[-1] in llm.llm_engine.engine_core.eos_token_ids
        )
    lp = outs[2].outputs[0].logprobs
    assert lp is not None and len(lp) == len(outs[2].outputs[0].token_ids)
    for tid, pos in zip(outs[2].outputs[0].token_ids, lp, strict=True):
        assert np.isfinite(pos[tid].logprob)  # sampled from the masked distribution


@pytest.mark.parametrize(
    ("so", "match"),
    [
        (SO(json={"type": 12}), "invalid JSON schema"),
        (SO(json={"type": "object", "properties": {"a": {"$ref": "#/nope"}}}), "JSON schema"),
        (SO(regex="(ab"), "invalid regex"),
        (SO(grammar="root ::= missing_rule"), "invalid grammar"),
    ],
)
def test_invalid_spec_fails_at_add(llm: LLM, so: SO, match: str) -> None:
    engine = llm.llm_engine
    with pytest.raises(ValueError, match=match):
        engine.add_request("bad", "Hi", SamplingParams(structured_outputs=so))
    assert not engine.has_unfinished_requests()
    assert (
        len(engine.engine_core.structured) == 0 and engine.engine_core.registry.get("bad") is None
    )
    stats = engine.kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_params_validate_and_serialize_field_by_field() -> None:
    for kw, match in [
        ({}, "exactly one"),
        ({"regex": "a", "choice": ["a"]}, "exactly one"),
        ({"json": "{not json"}, "not valid JSON"),
        ({"choice": []}, "non-empty list"),
        ({"grammar": ""}, "non-empty string"),
        ({"json_object": True, "whitespace_pattern": r"\s*"}, "whitespace_pattern"),
    ]:
        with pytest.raises(ValueError, match=match):
            SO(**kw)
    with pytest.raises(ValueError, match="unknown fields"):
        SamplingParams(structured_outputs={"jsn": {}})
    p = SamplingParams(n=2, temperature=0.5, structured_outputs=SO(json=PERSON))
    wire = msgspec.msgpack.encode(dataclasses.asdict(p))
    back = SamplingParams(**msgspec.msgpack.decode(wire))
    assert back == p and isinstance(back.structured_outputs, SO)
    c = p.clone()
    assert c == p
    assert c.structured_outputs is not None and p.structured_outputs is not None
    c.structured_outputs.json["required"].append("x")  # type: ignore[index]
    assert p.structured_outputs.json["required"] == ["name", "age", "pets"]  # type: ignore[index]


def test_bitmask_equals_xgrammar_per_token(llm: LLM) -> None:
    engine = llm.llm_engine
    tok = engine.tokenizer
    manager = engine.engine_core.structured
    compiled = manager.compile(SO(json=PERSON))
    # Request A: one sequence, 5 tokens in; request B: three fresh sequences
    # (its first sample row samples 3); request 7 has no grammar.
    manager.add([10**9], compiled)
    manager.add([2 * 10**9, 2 * 10**9 + 1, 2 * 10**9 + 2], compiled)
    prefix = tok.encode('{"name": "Al', add_special_tokens=False)
    try:
        for t in prefix:
            assert not manager.accept(10**9, t)
        batch = SimpleNamespace(
            sample_request_ids=np.array([7, 10**9, 2 * 10**9], dtype=np.uint64),
            num_samples=np.array([1, 1, 3], dtype=np.int32),
            num_drafts=0,
        )
        fill = manager.start_fill(batch)  # type: ignore[arg-type]
        assert fill is not None
        mask = manager.finish_fill(fill)
    finally:
        manager.release([10**9])
        manager.release([2 * 10**9, 2 * 10**9 + 1, 2 * 10**9 + 2])
    assert len(manager) == 0
    bits = mask.bitmask
    assert bits.shape == (5, (manager.compiler.vocab_size + 31) // 32)
    assert mask.rows == [1, 2, 3, 4]
    assert bool((bits[0] == -1).all())  # no grammar: unmasked

    def allowed(row: int, token: int) -> bool:
        return bool((int(bits[row, token // 32]) >> (token % 32)) & 1)

    def reference(tokens: list[int]) -> xgr.GrammarMatcher:
        m = xgr.GrammarMatcher(compiled)
        for t in tokens:
            assert m.accept_token(t)
        return m

    rng = np.random.default_rng(0)
    probes = [
        *tok.encode('ice", "age": 3, "pets": []}', add_special_tokens=False),
        *(tok.encode(s, add_special_tokens=False)[0] for s in ("{", " {", "\n", "[")),
        *rng.integers(0, len(tok), 40).tolist(),
        *engine.engine_core.eos_token_ids,
    ]
    for row, history in [(1, prefix), (2, []), (4, [])]:
        ref = reference(history)
        n_allowed = 0
        for t in probes:
            ok = ref.accept_token(t)
            if ok:
                ref.rollback(1)
                n_allowed += 1
            assert allowed(row, t) == ok, (row, t, tok.decode([t]))
        assert 0 < n_allowed < len(probes)
    assert bool((bits[2] == bits[4]).all())


def test_bitmask_masks_logits_padding(llm: LLM) -> None:
    vocab = llm.llm_engine.engine_core.structured.compiler.vocab_size
    words = (vocab + 31) // 32
    bitmask = torch.full((3, words), -1, dtype=torch.int32)
    bitmask[1] = 0
    bitmask[1, 0] = 0b101  # tokens 0 and 2
    logits = torch.zeros(3, vocab + 64)
    apply_bitmask(logits, StepBitmask(bitmask, [1], vocab))
    assert bool(torch.isfinite(logits[[0, 2]]).all())  # rows without a grammar
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [0, 2]


def test_spec_is_canonical() -> None:
    a = GrammarSpec.from_params(SO(json=PERSON))
    b = GrammarSpec.from_params(SO(json=json.dumps(PERSON, indent=2)))
    assert a == b and a != GrammarSpec.from_params(SO(json=PERSON, disable_any_whitespace=True))
    choice = GrammarSpec.from_params(SO(choice=['say "hi"', "back\\slash", "日本"]))
    assert choice.kind == "grammar"
    choice.build()  # quotes and backslashes escaped, UTF-8 kept


def test_matchers_dropped_on_finish_and_abort(llm: LLM) -> None:
    engine = llm.llm_engine
    engine.add_request("a", chat(llm, "Describe a person."), sampled(SO(json=PERSON), 3, 5))
    engine.add_request("b", "Hi", greedy(SO(regex=PHONE)))
    assert len(engine.engine_core.structured) == 4
    for _ in range(3):
        engine.step()
    assert engine.abort_request("a") is not None
    assert len(engine.engine_core.structured) == 1
    while engine.has_unfinished_requests():
        engine.step()
    assert len(engine.engine_core.structured) == 0
    stats = engine.kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_grammar_requests_leave_other_outputs_unchanged(llm: LLM) -> None:
    plain = SamplingParams(temperature=0.0, max_tokens=24)
    alone = llm.generate(PLAIN, plain, use_tqdm=False)
    grammar_prompts = [chat(llm, "Describe a person as JSON."), chat(llm, "A phone number?")]
    mixed = llm.generate(
        [PLAIN[0], grammar_prompts[0], PLAIN[1], grammar_prompts[1], PLAIN[2]],
        [plain, greedy(SO(json=PERSON)), plain, sampled(SO(regex=PHONE), 2, 9), plain],
        use_tqdm=False,
    )
    got = [mixed[i].outputs[0].token_ids for i in (0, 2, 4)]
    assert got == [o.outputs[0].token_ids for o in alone]
    jsonschema.validate(json.loads(mixed[1].outputs[0].text), PERSON)


def test_preemption_keeps_matchers_valid(default_model_dir: Path, llm: LLM) -> None:
    prompts = [chat(llm, f"Describe person number {i} as JSON.") for i in range(3)]
    params = greedy(SO(json=PERSON), max_tokens=48)
    small = LLM(
        str(default_model_dir),
        max_model_len=192,
        block_size=16,
        num_gpu_blocks_override=14,
        batch_invariant=True,
    )
    preempted = small.generate(prompts, params, use_tqdm=False)
    assert small.kv_cache_stats()["num_preemptions"] > 0
    assert len(small.llm_engine.engine_core.structured) == 0
    reference = llm.generate(prompts, params, use_tqdm=False)
    for a, b in zip(preempted, reference, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        jsonschema.validate(json.loads(a.outputs[0].text), PERSON)


def test_beam_search_refuses_structured_outputs(llm: LLM) -> None:
    with pytest.raises(TypeError, match="beam search does not support structured outputs"):
        llm.beam_search(["Hi"], greedy(SO(regex=PHONE)), use_tqdm=False)  # type: ignore[arg-type]
    assert BeamSearchParams(beam_width=2).beam_width == 2
    assert not llm.llm_engine.has_unfinished_requests()


def test_bitmask_fills_on_a_worker_thread_during_the_forward(
    llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = llm.llm_engine
    events: list[tuple[str, str, float]] = []
    fill, execute = engine.engine_core.structured._fill, engine.engine_core.runner.execute

    def timed_fill(*args: object) -> StepBitmask:
        events.append(("fill", threading.current_thread().name, time.perf_counter()))
        return fill(*args)  # type: ignore[arg-type]

    def timed_execute(*args: object) -> object:
        events.append(("forward", threading.current_thread().name, time.perf_counter()))
        out = execute(*args)  # type: ignore[arg-type]
        events.append(("forward end", threading.current_thread().name, time.perf_counter()))
        return out

    monkeypatch.setattr(engine.engine_core.structured, "_fill", timed_fill)
    monkeypatch.setattr(engine.engine_core.runner, "execute", timed_execute)
    engine.add_request("overlap", "Hi", greedy(SO(regex=PHONE), max_tokens=4))
    engine.step()
    engine.abort_request("overlap")
    by_kind = {kind: (thread, t) for kind, thread, t in events}
    assert by_kind["fill"][0].startswith("pagedrs-grammar")
    assert by_kind["forward"][0] == threading.current_thread().name
    assert by_kind["fill"][1] < by_kind["forward end"][1]  # started before the forward ended
    assert len(engine.engine_core.structured) == 0
