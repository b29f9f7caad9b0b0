"""Structured outputs: the cost of grammar bitmasks per step, and how much of it the
forward hides.

For each batch size R, R chat prompts asking for a person as JSON run once without
a grammar and once with a JSON schema (temperature 1, seeded). The engine counts the
time its worker thread spent filling bitmasks (``fill_s``) and the time the step then
waited for it after the forward (``wait_s``: the part not hidden). A microbenchmark
adds the fill and the apply alone, with nothing running beside them.

    python benches/bench_structured.py [--sizes 1 8 32] [--max-tokens 48] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch
import xgrammar as xgr
from common import print_table
from pagedrs import LLM, SamplingParams
from pagedrs.sampling_params import StructuredOutputsParams
from pagedrs.structured_output import GrammarSpec, StepBitmask, apply_bitmask

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
    },
    "required": ["name", "age", "city"],
}


def run(llm: LLM, prompts: list[str], max_tokens: int, grammar: bool) -> dict[str, Any]:
    so = StructuredOutputsParams(json=SCHEMA) if grammar else None
    params = [
        SamplingParams(temperature=1.0, seed=i, max_tokens=max_tokens, structured_outputs=so)
        for i in range(len(prompts))
    ]
    engine = llm.llm_engine
    before = dict(engine.engine_core.structured.stats())
    steps0 = engine.kv_cache_stats()["num_steps"]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t0
    after = engine.engine_core.structured.stats()
    fills = after["num_fills"] - before["num_fills"]
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    valid = 0
    for o in outs:
        try:
            json.loads(o.outputs[0].text)
            valid += 1
        except ValueError:
            pass
    return {
        "seconds": dt,
        "tokens": tokens,
        "tokens_per_s": tokens / dt,
        "steps": engine.kv_cache_stats()["num_steps"] - steps0,
        "fills": fills,
        "rows_per_fill": (after["rows_filled"] - before["rows_filled"]) / max(fills, 1),
        "fill_ms_per_step": 1e3 * (after["fill_s"] - before["fill_s"]) / max(fills, 1),
        "wait_ms_per_step": 1e3 * (after["wait_s"] - before["wait_s"]) / max(fills, 1),
        "valid_json": valid,
    }


def micro(llm: LLM, rows: int, repeat: int = 20) -> dict[str, float]:
    """Fill and apply alone: ``rows`` matchers inside a JSON string (the widest mask)."""
    engine = llm.llm_engine
    compiled = engine.engine_core.structured.compiler.compile(
        GrammarSpec.from_params(StructuredOutputsParams(json=SCHEMA))
    )
    prefix = engine.tokenizer.encode('{"name": "Al', add_special_tokens=False)
    matchers = [xgr.GrammarMatcher(compiled) for _ in range(rows)]
    for m in matchers:
        for t in prefix:
            assert m.accept_token(t)
    vocab = engine.engine_core.structured.compiler.vocab_size
    batch = xgr.BatchGrammarMatcher(max_threads=1)
    bitmask = xgr.allocate_token_bitmask(rows, vocab)
    t0 = time.perf_counter()
    for _ in range(repeat):
        batch.batch_fill_next_token_bitmask(matchers, bitmask)
    fill = (time.perf_counter() - t0) / repeat
    logits = torch.randn(rows, engine.engine_core.model.config.vocab_size)
    mask = StepBitmask(bitmask, list(range(rows)), vocab)
    t0 = time.perf_counter()
    for _ in range(repeat):
        apply_bitmask(logits, mask)
    apply = (time.perf_counter() - t0) / repeat
    return {"rows": rows, "fill_ms": 1e3 * fill, "apply_ms": 1e3 * apply}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON at the end")
    args = ap.parse_args()
    llm = LLM(max_model_len=512)
    tok = llm.get_tokenizer()
    results: dict[str, Any] = {"runs": [], "micro": []}
    for r in args.sizes:
        prompts = [
            tok.apply_chat_template(
                [{"role": "user", "content": f"Describe person number {i} as JSON."}],
                tokenize=False,
                add_generation_prompt=True,
            )
            for i in range(r)
        ]
        run(llm, prompts[:1], 4, True)  # warm-up: vocabulary and grammar compiled
        plain = run(llm, prompts, args.max_tokens, False)
        constrained = run(llm, prompts, args.max_tokens, True)
        results["runs"].append({"R": r, "plain": plain, "grammar": constrained})
        results["micro"].append(micro(llm, r))
    print_table(
        "JSON schema vs unconstrained (temperature 1, seeded)",
        ["R", "plain tok/s", "grammar tok/s", "rows/fill", "fill ms/step", "wait ms/step",
         "valid JSON"],
        [[x["R"], x["plain"]["tokens_per_s"], x["grammar"]["tokens_per_s"],
          x["grammar"]["rows_per_fill"], x["grammar"]["fill_ms_per_step"],
          x["grammar"]["wait_ms_per_step"], f"{x['grammar']['valid_json']}/{x['R']}"]
         for x in results["runs"]],
    )  # fmt: skip
    print_table(
        "Fill and apply alone (matchers inside a JSON string)",
        ["rows", "fill ms", "apply ms"],
        [[m["rows"], m["fill_ms"], m["apply_ms"]] for m in results["micro"]],
    )
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
