"""Drafts of a structured-output request, without a model: the step's bitmask
has one row per draft position, each equal to what xgrammar's matcher allows
after the verified tokens and the drafts before it; a draft the grammar
refuses ends the filled rows there; the matcher is rolled back to the
verified tokens, so that only the tokens verification keeps advance it. On
the default model, JSON-schema and regex requests with ngram drafts give the
outputs of speculation off, valid."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import torch
import xgrammar as xgr
from pagedrs import LLM, SamplingParams
from pagedrs.sampling_params import StructuredOutputsParams
from pagedrs.spec_decode.verify import VerifyPlan
from pagedrs.structured_output import GrammarCompilerCache, StructuredOutputManager
from pagedrs.structured_output.bitmask import apply_bitmask
from spec_engines import PROMPTS
from test_verify_rows import _batch

#: A character vocabulary: token i is VOCAB[i]; the last one is the stop token.
VOCAB = ["a", "b", ",", "x", "ab", "</s>"]
EOS = len(VOCAB) - 1
A, B, COMMA, X, AB = range(5)
REGEX = r"(ab|ba)(,(ab|ba))*"


def _manager() -> StructuredOutputManager:
    cache = GrammarCompilerCache(VOCAB, len(VOCAB), [EOS])
    cache._info = xgr.TokenizerInfo(VOCAB, stop_token_ids=[EOS])
    return StructuredOutputManager(cache, fill_threads=1)


def _allowed(m: xgr.GrammarMatcher) -> set[int]:
    """The tokens ``m`` allows next, from its own bitmask."""
    mask = xgr.allocate_token_bitmask(1, len(VOCAB))
    m.fill_next_token_bitmask(mask)
    return _row(mask, 0)


def _row(mask: torch.Tensor, r: int) -> set[int]:
    return {t for t in range(len(VOCAB)) if int(mask[r, t // 32]) >> (t % 32) & 1}


def test_one_bitmask_row_per_draft_position_and_rollback() -> None:
    mgr = _manager()
    compiled = mgr.compile(_regex())
    # Sequence 0 (grammar): verified "ab", drafts ",", "b", "a", "x" (refused),
    # ","; sequence 1 (no grammar) two samples; sequence 2 (grammar): verified
    # "ab", drafts "," "ab" "</s>" (complete), "a"; sequence 3 (grammar) no drafts.
    mgr.add([0], compiled)
    mgr.add([2], compiled)
    mgr.add([3], compiled)
    for sid in (0, 2, 3):
        assert mgr._matchers[sid].accept_token(AB)
    drafts = [[COMMA, B, A, X, COMMA], [], [COMMA, AB, EOS, A], []]
    batch = _batch(drafts, [1, 2, 1, 1], [-1] * 4, [0.0] * 4)
    plan = VerifyPlan.from_batch(batch)
    fill = mgr.start_fill(batch)
    assert fill is not None
    mask = mgr.finish_fill(fill)
    total = int(plan.rows.num_samples.sum())
    assert mask.bitmask.shape[0] == total == 6 + 2 + 5 + 1

    # Reference: a fresh matcher for each position.
    def expected(prefix: list[int]) -> set[int]:
        m = xgr.GrammarMatcher(compiled)
        for t in [AB, *prefix]:
            assert m.accept_token(t)
        return _allowed(m)

    first = plan.first_sample.tolist()
    # Sequence 0: rows for positions 0..3 (the refused "x" at 3 included).
    s0 = first[0]
    for j in range(4):
        assert _row(mask.bitmask, s0 + j) == expected(drafts[0][:j]), j
    assert X not in _row(mask.bitmask, s0 + 3)
    # Sequence 2: positions 0..2; after the stop token nothing is filled.
    s2 = first[2]
    for j in range(3):
        assert _row(mask.bitmask, s2 + j) == expected(drafts[2][:j]), j
    assert EOS in _row(mask.bitmask, s2 + 2)
    s3 = first[3]
    assert mask.rows == [*range(s0, s0 + 4), *range(s2, s2 + 3), s3]
    assert _row(mask.bitmask, s3) == expected([])
    # Rows outside the grammar rows allow every token.
    others = [i for i in range(total) if i not in mask.rows]
    assert (mask.bitmask[others] == -1).all()
    # Every matcher is back at its verified tokens.
    for sid in (0, 2, 3):
        assert _allowed(mgr._matchers[sid]) == expected([])
    assert mgr.stats()["draft_rows"] == 2 and mgr.stats()["drafts_refused"] == 1

    # Masked greedy rows pick the grammar's tokens; verification keeps the
    # drafts up to the refused one and never past it.
    logits = torch.zeros(total, len(VOCAB))
    logits[:, X] = 5.0  # the model prefers the refused token everywhere
    for j, t in enumerate(drafts[0][:3]):
        logits[s0 + j, t] = 9.0
    apply_bitmask(logits, mask)
    tokens = logits.argmax(dim=-1).numpy().astype(np.int64)
    v = plan.verify(tokens)
    assert int(v.num_accepted[0]) == 3
    assert int(tokens[s0 + 3]) != X
    mgr.close()


def test_verified_tokens_advance_the_matcher() -> None:
    mgr = _manager()
    compiled = mgr.compile(_regex())
    mgr.add([0], compiled)
    batch = _batch([[A, B, COMMA]], [1], [-1], [0.0])
    fill = mgr.start_fill(batch)
    assert fill is not None
    mgr.finish_fill(fill)
    # Verification rejected the drafts; the target's tokens "b", then "a"
    # (next step) are the verified ones.
    for t in (B, A):
        assert not mgr.accept(0, t)
    m = xgr.GrammarMatcher(compiled)
    for t in (B, A):
        assert m.accept_token(t)
    assert _allowed(mgr._matchers[0]) == _allowed(m)
    mgr.close()


def _regex() -> StructuredOutputsParams:
    return StructuredOutputsParams(regex=REGEX)


FRUITS = "apples|pears|plums|cherries|grapes|lemons|limes"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "pets"],
}
PERSON_JSON = '{"name": "Ada Lovelace", "age": 36, "pets": ["cat", "owl", "horse"]}'
GRAMMAR_PROMPTS = [
    f"Copy the JSON object exactly.\nObject: {PERSON_JSON}\nCopy: ",
    f"Copy the JSON object exactly.\nObject: {PERSON_JSON}\nObject: {PERSON_JSON}\nCopy: ",
    "Repeat the list exactly.\nList: apples, pears, plums, cherries, grapes, lemons, limes.\n"
    "Repeated list: ",
    "Repeat the list exactly.\nList: limes, lemons, grapes, cherries, plums, pears, apples.\n"
    "Repeated list: ",
]
REGEX_LIST = rf"({FRUITS})(, ({FRUITS}))*\."


def _grammar_params() -> list[SamplingParams]:
    def params(so: StructuredOutputsParams) -> SamplingParams:
        return SamplingParams(max_tokens=40, temperature=0.0, logprobs=2, structured_outputs=so)

    schema = params(StructuredOutputsParams(json=PERSON))
    regex = params(StructuredOutputsParams(regex=REGEX_LIST))
    return [schema, schema, regex, regex]


def test_structured_outputs_with_ngram_drafts_equal_off(ngram: LLM, off: LLM) -> None:
    """JSON-schema and regex requests speculate (their drafts are checked
    against the grammar) beside plain greedy ones: every output equals the
    engine's without speculation, token ids and logprobs, and obeys its
    grammar."""
    from test_greedy_identity import GREEDY, _result

    core = ngram.llm_engine.engine_core
    before = core.structured.stats()
    prompts = [*GRAMMAR_PROMPTS, PROMPTS[0], PROMPTS[2]]
    params = [*_grammar_params(), GREEDY, GREEDY]
    got = ngram.generate(prompts, params, use_tqdm=False)
    want = off.generate(prompts, params, use_tqdm=False)
    assert _result(got) == _result(want)
    for o in got[:2]:
        jsonschema.validate(json.loads(o.outputs[0].text), PERSON)
        assert o.outputs[0].finish_reason == "stop"
    for o in got[2:4]:
        assert re.fullmatch(REGEX_LIST, o.outputs[0].text), o.outputs[0].text
    # The grammar requests speculated: drafts checked by their grammar,
    # accepted ones among them.
    metrics = [o.metrics for o in got[:4]]
    assert all(m is not None and m.spec_num_draft_tokens > 0 for m in metrics)
    assert sum(m.spec_num_accepted_tokens for m in metrics if m is not None) > 0
    after = core.structured.stats()
    assert after["draft_rows"] > before["draft_rows"]
    assert after["live_matchers"] == 0
    assert ngram.llm_engine.kv_cache_stats()["num_used_blocks"] == 0
