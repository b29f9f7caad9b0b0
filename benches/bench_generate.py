"""Offline throughput: pagedrs vs HF transformers' static-batch ``generate``.

64 Alpaca-like prompts (chat template applied), up to 128 new tokens, greedy.
pagedrs runs them all through continuous batching on the paged KV cache; HF runs
static batches of 16 with left padding. Both are measured in this one run on the
same float32 weights and the same prompt token ids.

    python benches/bench_generate.py [--num-prompts 64] [--max-tokens 128] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from common import alpaca_prompts, print_table
from pagedrs import LLM, SamplingParams
from pagedrs.executor.model_loader import resolve_model
from pagedrs.executor.model_registry import DEFAULT_MODEL
from transformers import AutoModelForCausalLM


def bench_pagedrs(llm: LLM, prompts: list[list[int]], max_tokens: int) -> tuple[float, int]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    dt = time.perf_counter() - t0
    return dt, sum(len(o.outputs[0].token_ids) for o in outs)


def bench_hf(
    model_dir: str, prompts: list[list[int]], max_tokens: int, batch: int, pad_id: int, eos: int
) -> tuple[float, int]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    n_out = 0
    t0 = time.perf_counter()
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        with torch.inference_mode():
            gen = model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=pad_id,
                eos_token_id=eos,
            )
        for row in gen[:, width:].tolist():
            n_out += row.index(eos) + 1 if eos in row else len(row)
    return time.perf_counter() - t0, n_out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--hf-batch", type=int, default=16)
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    args = ap.parse_args()

    torch.manual_seed(0)
    model_dir, _ = resolve_model(DEFAULT_MODEL)
    llm = LLM(str(model_dir))
    tok = llm.get_tokenizer()
    prompts = [
        tok(
            tok.apply_chat_template(
                [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
            ),
            add_special_tokens=False,
        ).input_ids
        for p in alpaca_prompts(args.num_prompts)
    ]
    eos = llm.llm_engine.eos_token_ids[0]
    bench_pagedrs(llm, prompts[:2], 4)  # warm-up
    p_dt, p_tok = bench_pagedrs(llm, prompts, args.max_tokens)
    h_dt, h_tok = bench_hf(
        str(model_dir), prompts, args.max_tokens, args.hf_batch, tok.pad_token_id or 0, eos
    )
    p_tps, h_tps = p_tok / p_dt, h_tok / h_dt
    print_table(
        f"Offline throughput, {len(prompts)} Alpaca-like prompts, <= {args.max_tokens} new "
        f"tokens, greedy, {DEFAULT_MODEL} float32, {torch.get_num_threads()} threads",
        ["engine", "output tokens", "seconds", "tokens/s"],
        [
            ["pagedrs", p_tok, p_dt, p_tps],
            [f"HF generate (static batch {args.hf_batch})", h_tok, h_dt, h_tps],
        ],
    )
    print(f"\nratio pagedrs / HF generate: {p_tps / h_tps:.2f}x")
    if args.json:
        print(
            json.dumps(
                {
                    "num_prompts": len(prompts),
                    "max_tokens": args.max_tokens,
                    "offline_tokens_per_s": {"pagedrs": p_tps, "hf-generate": h_tps},
                    "output_tokens": {"pagedrs": p_tok, "hf-generate": h_tok},
                    "ratio": p_tps / h_tps,
                }
            )
        )


if __name__ == "__main__":
    main()
