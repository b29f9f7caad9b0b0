"""Offline throughput: pagedrs vs HF transformers' static-batch ``generate`` (and
llama.cpp where ``llama-cpp-python`` is installed), by weights and KV cache dtype.

Requests: ``--num-prompts`` chats of the Alpaca-like (default) or ShareGPT-like
(``--dataset sharegpt``) data of ../shared/data, chat template applied, greedy.
Output lengths: up to ``--max-tokens`` new tokens, stopping at EOS (default), or
with ``--full-outputs`` exactly the data's reference reply length (capped at
``--max-tokens``, EOS ignored), so every engine does the same work.

pagedrs runs every request at once through continuous batching on the paged KV
cache, for each ``WEIGHTS/KV_CACHE_DTYPE`` pair of ``--dtype-configs``. The peers run
the first ``--peer-prompts`` requests, and pagedrs' best configuration runs those
same requests again for the ratio:

  HF generate   ``model.generate`` in static batches of ``--hf-batch`` (left
                padding), weights in ``--hf-dtype``; with ``--full-outputs`` each
                batch runs to its longest output, and only each request's own
                tokens count.
  llama.cpp     ``llama-cpp-python`` on the packaged GGUF (SmolLM2-135M-Instruct
                Q4_1), continuous batching through llama.cpp's batch API with
                ``--llama-cpp-parallel`` sequences at once (llama_cpp_peer.py);
                skipped when the package is missing.

    python benches/bench_generate.py [--num-prompts 64] [--max-tokens 128] [--json]
    python benches/bench_generate.py --dataset sharegpt --num-prompts 256 --full-outputs \\
        --max-tokens 2048 --dtype-configs float32/auto bfloat16/auto bfloat16/int8 \\
        --hf-dtype bfloat16 --peer-prompts 64 --json
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import llama_cpp_peer
import torch
from common import chat_prompt_ids, json_safe, load_trace, print_table
from pagedrs import LLM, SamplingParams
from pagedrs.engine.arg_utils import EngineArgs
from pagedrs.executor.model_loader import hf_folder
from pagedrs.executor.model_registry import DEFAULT_MODEL
from transformers import AutoModelForCausalLM, AutoTokenizer

#: A request: prompt token ids and its output length (None: up to --max-tokens, EOS stops).
Request = tuple[list[int], int | None]


def requests(args: argparse.Namespace, tok: Any) -> list[Request]:
    """The benchmark's requests, in data order."""
    trace = load_trace(args.dataset, tok, args.max_tokens, args.max_prompt_tokens)
    if len(trace) < args.num_prompts:
        raise SystemExit(
            f"{args.dataset} holds {len(trace)} usable records, not {args.num_prompts}"
        )
    return [
        (chat_prompt_ids(tok, r.messages), r.output_len if args.full_outputs else None)
        for r in trace[: args.num_prompts]
    ]


def bench_pagedrs(llm: LLM, reqs: list[Request], max_tokens: int) -> tuple[float, int]:
    """(seconds, output tokens) of every request at once."""
    params = [
        SamplingParams(temperature=0.0, max_tokens=n or max_tokens, ignore_eos=n is not None)
        for _, n in reqs
    ]
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p, _ in reqs], params, use_tqdm=False)
    dt = time.perf_counter() - t0
    return dt, sum(len(o.outputs[0].token_ids) for o in outs)


def bench_hf(
    model_dir: str, reqs: list[Request], max_tokens: int, batch: int, dtype: str, pad: int, eos: int
) -> tuple[float, int]:
    """(seconds, output tokens) of HF ``generate`` in static batches."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    n_out = 0
    t0 = time.perf_counter()
    for i in range(0, len(reqs), batch):
        chunk = reqs[i : i + batch]
        width = max(len(p) for p, _ in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in chunk])
        full = chunk[0][1] is not None
        new = max(n for _, n in chunk) if full else max_tokens  # type: ignore[type-var]
        with torch.inference_mode():
            gen = model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new if full else None,
                do_sample=False,
                pad_token_id=pad,
                eos_token_id=None if full else eos,
            )
        for row, (_, n) in zip(gen[:, width:].tolist(), chunk, strict=True):
            n_out += n if n is not None else (row.index(eos) + 1 if eos in row else len(row))
    return time.perf_counter() - t0, n_out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dataset", default="alpaca", choices=["alpaca", "sharegpt"])
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", type=int, default=1100)
    ap.add_argument("--full-outputs", action="store_true", help="the data's reply lengths")
    ap.add_argument(
        "--dtype-configs",
        nargs="+",
        default=["float32/auto"],
        help="pagedrs WEIGHTS/KV_CACHE_DTYPE pairs",
    )
    ap.add_argument("--dtype", default=None, help="with --kv-cache-dtype: one pair, WEIGHTS/KV")
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--peer-prompts", type=int, default=None, help="default: all")
    ap.add_argument("--hf-batch", type=int, default=16)
    ap.add_argument("--hf-dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--no-hf", action="store_true", help="skip HF generate")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp")
    ap.add_argument(
        "--llama-cpp-parallel",
        type=int,
        default=16,
        help="llama.cpp sequences decoded at once (16 ran fastest here of 1-64)",
    )
    ap.add_argument(
        "--llama-cpp-flash-attn",
        default="auto",
        choices=["auto", "on", "off"],
        help="llama.cpp flash attention (auto: llama.cpp's choice)",
    )
    ap.add_argument(
        "--llama-cpp-cache-type",
        default="f16",
        choices=sorted(llama_cpp_peer.CACHE_TYPES),
        help="llama.cpp KV cache type (q8_0 needs flash attention)",
    )
    ap.add_argument(
        "--llama-cpp-unified",
        action="store_true",
        help="llama.cpp: one pool of KV cells for all sequences",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    args = ap.parse_args()
    if args.dtype is not None:
        args.dtype_configs = [f"{args.dtype}/{args.kv_cache_dtype}"]
    for pair in args.dtype_configs:
        w, _, kv = pair.partition("/")
        EngineArgs(dtype=w, kv_cache_dtype=kv or "auto")  # fail fast on a bad pair

    torch.manual_seed(0)
    model_dir = str(hf_folder(DEFAULT_MODEL))
    tok = AutoTokenizer.from_pretrained(model_dir)
    reqs = requests(args, tok)
    peer_reqs = reqs[: args.peer_prompts or len(reqs)]
    rows: list[list[Any]] = []
    tps: dict[str, float] = {}
    out_tokens: dict[str, int] = {}
    best: tuple[float, str] | None = None
    for pair in args.dtype_configs:
        weights, _, kv = pair.partition("/")
        llm = LLM(model_dir, dtype=weights, kv_cache_dtype=kv or "auto")
        bench_pagedrs(llm, reqs[:2], 4)  # warm-up
        dt, n = bench_pagedrs(llm, reqs, args.max_tokens)
        tps[pair], out_tokens[pair] = n / dt, n
        rows.append([f"pagedrs {pair}", len(reqs), n, dt, n / dt])
        if best is None or n / dt > best[0]:
            best = (n / dt, pair)
        llm.shutdown()
    assert best is not None
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    peers: dict[str, float] = {}
    if len(peer_reqs) < len(reqs) and (not args.no_hf or not args.no_llama_cpp):
        weights, _, kv = best[1].partition("/")
        llm = LLM(model_dir, dtype=weights, kv_cache_dtype=kv or "auto")
        dt, n = bench_pagedrs(llm, peer_reqs, args.max_tokens)
        llm.shutdown()
        peers[f"pagedrs {best[1]}"] = n / dt
        rows.append([f"pagedrs {best[1]}", len(peer_reqs), n, dt, n / dt])
    else:
        peers[f"pagedrs {best[1]}"] = best[0]
    if not args.no_hf:
        dt, n = bench_hf(
            model_dir, peer_reqs, args.max_tokens, args.hf_batch, args.hf_dtype, pad, eos
        )
        peers["hf-generate"] = n / dt
        rows.append(
            [f"HF generate {args.hf_dtype} (batch {args.hf_batch})", len(peer_reqs), n, dt, n / dt]
        )
    if not args.no_llama_cpp:
        if not llama_cpp_peer.available():
            print("llama.cpp: llama-cpp-python not installed, skipped")
        else:
            from pagedrs.executor.model_registry import fetch_gguf

            dt, outs = llama_cpp_peer.run_batched(
                fetch_gguf(DEFAULT_MODEL),
                peer_reqs,
                args.max_tokens,
                torch.get_num_threads(),
                parallel=args.llama_cpp_parallel,
                flash_attn={"auto": None, "on": True, "off": False}[args.llama_cpp_flash_attn],
                cache_type=args.llama_cpp_cache_type,
                unified=args.llama_cpp_unified,
            )
            n = sum(map(len, outs))
            peers["llama.cpp"] = n / dt
            label = f"llama.cpp Q4_1 GGUF ({args.llama_cpp_parallel} sequences batched)"
            rows.append([label, len(peer_reqs), n, dt, n / dt])
    outputs = "reference reply lengths" if args.full_outputs else "EOS or"
    print_table(
        f"Offline throughput, {args.dataset}-like requests, {outputs} <= {args.max_tokens} new "
        f"tokens, greedy, {DEFAULT_MODEL}, {torch.get_num_threads()} threads",
        ["engine", "requests", "output tokens", "seconds", "tokens/s"],
        rows,
    )
    ours = peers[f"pagedrs {best[1]}"]
    ratios = {k: ours / v for k, v in peers.items() if not k.startswith("pagedrs")}
    for k, r in ratios.items():
        print(f"ratio pagedrs {best[1]} / {k} (same {len(peer_reqs)} requests): {r:.2f}x")
    if args.json:
        result = {
            "dataset": args.dataset,
            "num_prompts": len(reqs),
            "max_tokens": args.max_tokens,
            "full_outputs": args.full_outputs,
            "threads": torch.get_num_threads(),
            "configs": tps,
            "best_config": best[1],
            "peer_prompts": len(peer_reqs),
            "peers_tokens_per_s": peers,
            "ratio_over_peers": ratios,
        }
        if args.dtype_configs == ["float32/auto"]:
            result["offline_tokens_per_s"] = {
                "pagedrs": tps["float32/auto"],
                **{k: v for k, v in peers.items() if not k.startswith("pagedrs")},
            }
            result["ratio"] = ratios.get("hf-generate")
        print(json.dumps(json_safe(result)))


if __name__ == "__main__":
    main()
