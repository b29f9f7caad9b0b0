"""Hybrid KV cache (sliding-window groups hold only their window's blocks) vs
allocating every layer's KV as full attention.

Three parts, all measured in this run:

1. ``gemma3_like``: requests that can run at once under one KV budget. A
   Gemma-3-like shape (48 layers, 5 sliding : 1 full, window 1024, 4 KV heads,
   head_dim 256, bf16, block 16) in a fixed 8 GiB pool. Layers are grouped as
   vLLM does: 6 KV cache groups of 8 layers, one page (block id) = 8 layers'
   K and V of 16 tokens (512 KiB), so the pool is 16,384 blocks either way:
   hybrid is ``kv_cache_groups=[None, 1024, 1024, 1024, 1024, 1024]``, full
   allocation ``[None] * 6``. Every request has an 8191-token prompt (random ids,
   no stop tokens) and all are added at once to the real Rust scheduler
   (``pagedrs._core.Scheduler``, chunked prefill, 2048 tokens per step, prefix
   caching off: the prompts share nothing). No model runs: every sampled token
   is a dummy id. "max concurrent" is the most sequences decoding in one step
   with at least 8192 tokens of context (past prefill, holding their whole
   context); ``max_tokens`` is 128 so that the first requests are still decoding
   when memory, not time, stops the next ones (a prompt takes 4+ steps to
   prefill), so contexts at that step are 8192 to about 8192 + 4 x the count.
   KV bytes per request: one request alone, right after the ``schedule()`` of its
   decode step with exactly 8192 tokens of context, ``stats().num_used_blocks`` x
   bytes per block. The analytic ratio is 8192 / (8192/6 + 5 x 1024/6): the full
   group keeps every token, the 5 sliding ones a window each.
2. ``sliding_only``: a Mistral-like shape (32 layers all sliding, window 4096,
   8 KV heads, head_dim 128, bf16, block 16: one group, 2 MiB a block): one
   request driven to each context length (prompt in chunks of 2048, then 3
   decode steps), KV bytes held right after the ``schedule()`` of the step with
   that context, ``kv_cache_groups=[4096]`` vs ``[None]``; also the peak over
   the run (a sliding group holds window + chunk during a prefill chunk).
   Plot of both against context under benches/results/ when matplotlib is
   importable (``pip install ".[bench]"``).
3. ``decode_tokens_per_s``: the engine end to end (``pagedrs.LLM``) on a tiny
   random-weight Gemma 3 text model (6 layers, 5 sliding : 1 full, window 512,
   float32, the default model's tokenizer), ``disable_hybrid_kv_cache_manager``
   False (hybrid: 6 groups of 1 layer) vs True (one full-attention group of all
   6 layers), same KV memory (enough that nothing is preempted): a few
   sequences with random prompts of each context length, 32 new tokens, greedy,
   ignore_eos; tokens/s over the steps after the last prompt is prefilled (pure
   decode), best of ``--repeats`` runs with the modes alternating, by the wall
   clock and by this process's CPU time (steadier when other work shares the
   cores). One torch thread by default (``--threads``): a tiny model's step is
   short and 2 OpenMP threads slow down by up to ~10x when another process
   holds a core. Skipped with a message where the engine lacks that argument.

    python benches/bench_hybrid.py [--json] [--quick] [--plot PATH | --no-plot]
        [--decode-seqs 4] [--decode-tokens 32] [--repeats 3] [--threads 1] [--skip-decode]

``--quick``: fewer requests in part 1, decode contexts 2048 and 4096 only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import print_table
from pagedrs._core import Scheduler

BLOCK_SIZE = 16
CHUNK = 2048  # max_num_batched_tokens: chunked prefill
DUMMY_TOKEN = 7
BF16 = 2
GIB = 1 << 30
MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Shape:
    """A model's KV shape and its grouping into KV cache groups of ``group_size`` layers."""

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    group_size: int
    hybrid_groups: tuple[int | None, ...]
    dtype_bytes: int = BF16

    @property
    def full_groups(self) -> tuple[None, ...]:
        return (None,) * len(self.hybrid_groups)

    @property
    def block_bytes(self) -> int:
        """One block id: K and V of ``group_size`` layers for BLOCK_SIZE tokens."""
        return (
            2 * self.group_size * self.num_kv_heads * BLOCK_SIZE * self.head_dim * self.dtype_bytes
        )

    def describe(self) -> str:
        windows = sorted({w for w in self.hybrid_groups if w is not None})
        n_sliding = sum(w is not None for w in self.hybrid_groups) * self.group_size
        n_groups = len(self.hybrid_groups)
        return (
            f"{self.name}: {self.num_layers} layers ({n_sliding} sliding, window "
            f"{'/'.join(map(str, windows))}; {self.num_layers - n_sliding} full), "
            f"{self.num_kv_heads} KV heads x head_dim {self.head_dim}, bf16, block {BLOCK_SIZE}; "
            f"{n_groups} group{'s' if n_groups > 1 else ''} of {self.group_size} layers, "
            f"{self.block_bytes // 1024} KiB a block"
        )


GEMMA3 = Shape("Gemma-3-like", 48, 4, 256, 8, (None, 1024, 1024, 1024, 1024, 1024))
MISTRAL = Shape("Mistral-like", 32, 8, 128, 32, (4096,))
GEMMA3_BUDGET = 8 * GIB
GEMMA3_CONTEXT = 8192
GEMMA3_MAX_TOKENS = 128
SLIDING_CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768)
DECODE_STEPS = 3  # sliding_only: decode steps after the prompt
DECODE_CONTEXTS = (2048, 4096, 8192)


def _scheduler(
    groups: tuple[int | None, ...], num_blocks: int, max_num_seqs: int, max_model_len: int
) -> Scheduler:
    return Scheduler(
        num_blocks,
        BLOCK_SIZE,
        max_num_seqs,
        CHUNK,
        max_model_len,
        enable_chunked_prefill=True,
        enable_prefix_caching=False,
        kv_cache_groups=list(groups),
    )


def one_request(groups: tuple[int | None, ...], context: int, num_blocks: int) -> dict[str, Any]:
    """Drive one request (prompt ``context - DECODE_STEPS`` tokens, then decode)
    to the step whose context is ``context`` tokens; blocks held right after that
    ``schedule()`` (total and per group) and the most held after any ``schedule()``."""
    prompt = context - DECODE_STEPS
    sched = _scheduler(groups, num_blocks, 1, context + 1)
    rng = np.random.default_rng(context)
    sched.add_request(0, rng.integers(3, 50000, prompt).astype(np.int64), DECODE_STEPS + 1, [])
    peak = 0
    at: dict[str, Any] | None = None
    while sched.has_unfinished_requests():
        out = sched.schedule()
        if out is None:
            raise RuntimeError(f"{groups}: nothing can run at context {context}")
        st = sched.stats()
        peak = max(peak, st.num_used_blocks)
        if int(out.batch.seq_lens[0]) == context:
            at = {
                "used_blocks": st.num_used_blocks,
                "group_blocks": [g.num_used_blocks for g in st.groups],
            }
        sched.update(np.full(out.batch.num_sampled_tokens, DUMMY_TOKEN, dtype=np.int64))
    assert at is not None, "never reached the context"
    st = sched.stats()
    assert st.num_free_blocks == st.num_total_blocks, "blocks leaked"
    return {**at, "peak_blocks": peak}


def max_concurrent(
    groups: tuple[int | None, ...], num_blocks: int, num_requests: int
) -> dict[str, Any]:
    """Every request (8191-token prompt, GEMMA3_MAX_TOKENS new tokens) added at
    once; the most sequences decoding in one step with >= GEMMA3_CONTEXT tokens
    of context, and the pool at that step."""
    prompt = GEMMA3_CONTEXT - 1
    sched = _scheduler(groups, num_blocks, 1024, prompt + GEMMA3_MAX_TOKENS)
    rng = np.random.default_rng(0)
    for i in range(num_requests):
        ids = rng.integers(3, 50000, prompt).astype(np.int64)
        sched.add_request(i, ids, GEMMA3_MAX_TOKENS, [])
    best: dict[str, Any] = {"count": 0}
    steps = 0
    t0 = time.perf_counter()
    while sched.has_unfinished_requests():
        out = sched.schedule()
        if out is None:
            raise RuntimeError(f"{groups}: requests left but nothing can run")
        steps += 1
        b = out.batch
        decoding = (np.diff(b.query_start_loc) == 1) & (b.seq_lens >= GEMMA3_CONTEXT)
        count = int(decoding.sum())
        if count > best["count"]:
            st = sched.stats()
            ctx = b.seq_lens[decoding]
            best = {
                "count": count,
                "step": steps,
                "running": st.num_running,
                "used_blocks": st.num_used_blocks,
                "context_min": int(ctx.min()),
                "context_max": int(ctx.max()),
            }
        sched.update(np.full(b.num_sampled_tokens, DUMMY_TOKEN, dtype=np.int64))
    st = sched.stats()
    assert st.num_free_blocks == st.num_total_blocks, "blocks leaked"
    return {
        **best,
        "steps": steps,
        "preemptions": st.num_preemptions,
        "seconds": time.perf_counter() - t0,
    }


def gemma3_like(num_requests: int) -> dict[str, Any]:
    shape = GEMMA3
    num_blocks = GEMMA3_BUDGET // shape.block_bytes
    res: dict[str, Any] = {"context_tokens": GEMMA3_CONTEXT}
    runs = {}
    for mode, groups in (("hybrid", shape.hybrid_groups), ("full", shape.full_groups)):
        one = one_request(groups, GEMMA3_CONTEXT, num_blocks)
        conc = max_concurrent(groups, num_blocks, num_requests)
        runs[mode] = {"one": one, "concurrent": conc}
        res[f"max_concurrent_{mode}"] = conc["count"]
        res[f"kv_bytes_per_request_{mode}"] = one["used_blocks"] * shape.block_bytes
    n_groups = len(shape.hybrid_groups)
    per_group_hybrid = sum(
        GEMMA3_CONTEXT if w is None else min(w, GEMMA3_CONTEXT) for w in shape.hybrid_groups
    )
    res["ratio"] = res["max_concurrent_hybrid"] / res["max_concurrent_full"]
    res["analytic_ratio"] = GEMMA3_CONTEXT / (per_group_hybrid / n_groups)
    res["share_of_analytic"] = res["ratio"] / res["analytic_ratio"]
    res["bytes_ratio"] = res["kv_bytes_per_request_full"] / res["kv_bytes_per_request_hybrid"]
    res["setting"] = {
        "kv_budget_bytes": GEMMA3_BUDGET,
        "num_blocks": num_blocks,
        "block_bytes": shape.block_bytes,
        "prompt_tokens": GEMMA3_CONTEXT - 1,
        "max_tokens": GEMMA3_MAX_TOKENS,
        "num_requests": num_requests,
        "max_num_batched_tokens": CHUNK,
    }
    res["runs"] = runs
    return res


def print_gemma3(res: dict[str, Any]) -> None:
    shape, s = GEMMA3, res["setting"]
    rows = []
    for mode in ("hybrid", "full"):
        r = res["runs"][mode]
        one, c = r["one"], r["concurrent"]
        rows.append(
            [
                mode,
                one["used_blocks"],
                "/".join(map(str, one["group_blocks"])),
                one["used_blocks"] * shape.block_bytes / MIB,
                s["num_blocks"] // one["used_blocks"],
                c["count"],
                f"{c['context_min']}-{c['context_max']}",
                f"{100 * c['used_blocks'] / s['num_blocks']:.1f}",
                c["preemptions"],
                c["steps"],
            ]
        )
    print_table(
        f"Requests at once, {GEMMA3_CONTEXT}-token contexts, {s['kv_budget_bytes'] // GIB} GiB "
        f"of KV ({s['num_blocks']} blocks); {shape.describe()}; {s['num_requests']} requests "
        f"of {s['prompt_tokens']} + {s['max_tokens']} tokens at once, chunks of {CHUNK}",
        [
            "allocation",
            "blocks/request",
            "per group",
            "MiB/request",
            "pool / request",
            "max concurrent",
            "their context",
            "pool used %",
            "preempt",
            "steps",
        ],
        rows,
    )
    others = ", ".join(
        f"{m} {res['runs'][m]['concurrent']['running'] - res['runs'][m]['concurrent']['count']}"
        for m in ("hybrid", "full")
    )
    print(
        "(pool / request: requests of that size the pool holds whole; max concurrent: the "
        "most decoding in one step, its context range; other running sequences at that step, "
        f"in prefill: {others})"
    )
    print(
        f"ratio hybrid / full: {res['ratio']:.2f} requests "
        f"({res['bytes_ratio']:.2f} in bytes per request); analytic "
        f"{GEMMA3_CONTEXT} / ({GEMMA3_CONTEXT}/6 + 5 x 1024/6) = {res['analytic_ratio']:.2f}; "
        f"measured / analytic = {100 * res['share_of_analytic']:.1f}% "
        f"({'>=' if res['share_of_analytic'] >= 0.95 else '<'} 95%)"
    )


def sliding_only() -> dict[str, Any]:
    shape = MISTRAL
    top = max(SLIDING_CONTEXTS)
    num_blocks = -(-top // BLOCK_SIZE) + CHUNK // BLOCK_SIZE + 8
    hybrid = [one_request(shape.hybrid_groups, c, num_blocks) for c in SLIDING_CONTEXTS]
    full = [one_request(shape.full_groups, c, num_blocks) for c in SLIDING_CONTEXTS]
    b = shape.block_bytes
    return {
        "context_tokens": list(SLIDING_CONTEXTS),
        "kv_bytes_hybrid": [r["used_blocks"] * b for r in hybrid],
        "kv_bytes_full": [r["used_blocks"] * b for r in full],
        "peak_kv_bytes_hybrid": [r["peak_blocks"] * b for r in hybrid],
        "peak_kv_bytes_full": [r["peak_blocks"] * b for r in full],
        "block_bytes": b,
        "num_blocks": num_blocks,
    }


def print_sliding(res: dict[str, Any], plot_note: str) -> None:
    rows = []
    for i, c in enumerate(res["context_tokens"]):
        h, f = res["kv_bytes_hybrid"][i], res["kv_bytes_full"][i]
        rows.append(
            [
                c,
                h / MIB,
                f / MIB,
                f / h,
                res["peak_kv_bytes_hybrid"][i] / MIB,
                res["peak_kv_bytes_full"][i] / MIB,
            ]
        )
    print_table(
        f"KV held by one request, {MISTRAL.describe()}; "
        f"prompt in chunks of {CHUNK}, held at the step with that context",
        ["context", "hybrid MiB", "full MiB", "full / hybrid", "hybrid peak MiB", "full peak MiB"],
        rows,
    )
    print(f"(peak: most held after any schedule(), prefill chunks included; {plot_note})")


def plot_sliding(res: dict[str, Any], path: Path) -> str:
    """PNG of KV bytes against context; a note for the table footer."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return 'no plot: matplotlib is not installed (pip install ".[bench]")'
    ctx = res["context_tokens"]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ax.plot(ctx, [b / GIB for b in res["kv_bytes_full"]], "o-", label="full allocation [None]")
    ax.plot(ctx, [b / GIB for b in res["kv_bytes_hybrid"]], "s-", label="sliding window [4096]")
    ax.plot(
        ctx,
        [b / GIB for b in res["peak_kv_bytes_hybrid"]],
        "s--",
        color="#f2b134",
        alpha=0.7,
        label="sliding window, peak (window + prefill chunk)",
    )
    ax.axvline(MISTRAL.hybrid_groups[0], color="#999999", ls=":", lw=1)
    ticks = [0, *(c for c in ctx if c >= 4096)]
    ax.set_xticks(ticks, [f"{c // 1024}k" if c else "0" for c in ticks])
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("KV cache held (GiB)")
    ax.set_title("One request, Mistral-like (32 layers, window 4096, bf16)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"plot: {path}"


def tiny_gemma3(folder: Path, max_len: int) -> None:
    """A random 6-layer Gemma 3 text model (5 sliding : 1 full, window 512) in
    ``folder``, with the default model's tokenizer."""
    import torch
    from pagedrs.executor.model_registry import DEFAULT_MODEL, converted_dir
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok_dir = converted_dir(DEFAULT_MODEL)
    if not (tok_dir / "tokenizer.json").exists():
        from pagedrs.executor.model_loader import hf_folder

        tok_dir = hf_folder(DEFAULT_MODEL)
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "gemma3_text",
        vocab_size=49152,  # the default model's tokenizer
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        query_pre_attn_scalar=32,
        sliding_window=512,
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
        max_position_embeddings=max_len,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tok_dir).save_pretrained(folder)


def has_hybrid_switch() -> bool:
    from pagedrs.engine.arg_utils import EngineArgs

    return "disable_hybrid_kv_cache_manager" in {f.name for f in dataclasses.fields(EngineArgs)}


def decode_run(llm: Any, prompts: list[list[int]], max_tokens: int) -> tuple[int, float, float]:
    """(tokens, wall seconds, CPU seconds of this process) of the steps after
    every prompt is prefilled."""
    from pagedrs import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    got = dict.fromkeys(range(len(prompts)), 0)
    base, t0, c0 = 0, None, 0.0
    while engine.has_unfinished_requests():
        for o in engine.step():
            got[int(o.request_id[1:])] = len(o.outputs[0].token_ids)
        if t0 is None and min(got.values()) > 0:
            base, t0, c0 = sum(got.values()), time.perf_counter(), time.process_time()
    assert t0 is not None and all(n == max_tokens for n in got.values())
    return sum(got.values()) - base, time.perf_counter() - t0, time.process_time() - c0


def decode_speed(
    contexts: tuple[int, ...], num_seqs: int, max_tokens: int, repeats: int, threads: int
) -> dict[str, Any]:
    """Decode tokens/s of the engine, hybrid vs full allocation, per context: the
    best of ``repeats`` runs of each (wall clock, and CPU time of this process),
    the two modes alternating."""
    import torch
    from pagedrs import LLM

    if threads > 0:
        torch.set_num_threads(threads)
    max_len = max(contexts) + max_tokens + BLOCK_SIZE
    # float32 K and V of 6 layers x 2 heads x 32 dims for every token of every
    # sequence, twice over: nothing is preempted in either mode.
    kv_bytes = 2 * (2 * 6 * 2 * 32 * 4) * num_seqs * max_len
    out: dict[str, Any] = {"contexts": list(contexts), "hybrid": {}, "full": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tiny_gemma3(Path(tmp), max_len)
        llms = {
            mode: LLM(
                model=tmp,
                dtype="float32",
                max_model_len=max_len,
                max_num_batched_tokens=CHUNK,
                kv_cache_memory_bytes=kv_bytes,
                enable_prefix_caching=False,
                disable_hybrid_kv_cache_manager=(mode == "full"),
            )
            for mode in ("hybrid", "full")
        }
        rng = np.random.default_rng(1)
        for llm in llms.values():  # warm-up
            decode_run(llm, [rng.integers(3, 49152, 64).tolist()], 4)
        for ctx in contexts:
            runs: dict[str, list[tuple[int, float, float]]] = {m: [] for m in llms}
            for _ in range(repeats):
                prompts = [rng.integers(3, 49152, ctx).tolist() for _ in range(num_seqs)]
                for mode, llm in llms.items():
                    runs[mode].append(decode_run(llm, prompts, max_tokens))
            for mode, rs in runs.items():
                n = rs[0][0]
                out[mode][ctx] = {
                    "tokens": n,
                    "tokens_per_s": max(r[0] / r[1] for r in rs),
                    "cpu_tokens_per_s": max(r[0] / r[2] for r in rs),
                    "runs_tokens_per_s": [r[0] / r[1] for r in rs],
                }
        out["groups"] = {
            mode: len(llm.llm_engine.kv_cache_stats()["groups"]) for mode, llm in llms.items()
        }
        for llm in llms.values():
            llm.shutdown()
    out["threads"] = torch.get_num_threads()
    out["repeats"] = repeats
    return out


def print_decode(res: dict[str, Any], num_seqs: int, max_tokens: int) -> None:
    rows = []
    for ctx in res["contexts"]:
        h, f = res["hybrid"][ctx], res["full"][ctx]
        rows.append(
            [
                ctx,
                h["tokens"],
                h["tokens_per_s"],
                f["tokens_per_s"],
                h["tokens_per_s"] / f["tokens_per_s"],
                h["cpu_tokens_per_s"],
                f["cpu_tokens_per_s"],
                h["cpu_tokens_per_s"] / f["cpu_tokens_per_s"],
            ]
        )
    print_table(
        f"Decode tokens/s, engine end to end: tiny random Gemma 3 text (6 layers 5:1, "
        f"window 512, hidden 128, float32), {num_seqs} sequences x {max_tokens} new tokens, "
        f"greedy, ignore_eos, {res['threads']} thread(s), best of {res['repeats']}; "
        f"KV cache groups: hybrid {res['groups']['hybrid']}, full {res['groups']['full']}",
        [
            "context",
            "decode tokens",
            "hybrid tok/s",
            "full tok/s",
            "hybrid / full",
            "hybrid tok/CPU-s",
            "full tok/CPU-s",
            "hybrid / full (CPU)",
        ],
        rows,
    )
    print(
        "(over the steps after the last prompt is prefilled: pure decode; tok/CPU-s divides "
        "by this process's CPU time, steadier than the wall clock when other work shares the "
        "cores)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer requests, decode at 2k and 4k")
    ap.add_argument(
        "--plot", type=Path, default=Path(__file__).parent / "results" / "hybrid_sliding.png"
    )
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--decode-seqs", type=int, default=4)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="decode runs per mode and context")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for the decode part (0: torch's default); 1 keeps a tiny model's "
        "steps steady when another process holds a core",
    )
    ap.add_argument("--skip-decode", action="store_true", help="parts 1 and 2 only")
    ap.add_argument("--json", action="store_true", help="one JSON object as the last line")
    args = ap.parse_args()

    g3 = gemma3_like(24 if args.quick else 40)
    print_gemma3(g3)
    so = sliding_only()
    note = "no plot: --no-plot" if args.no_plot else plot_sliding(so, args.plot)
    print_sliding(so, note)

    decode: dict[str, Any] | None = None
    if args.skip_decode:
        print("\ndecode tokens/s: skipped (--skip-decode)")
    elif not has_hybrid_switch():
        print(
            "\ndecode tokens/s: skipped: this engine has no disable_hybrid_kv_cache_manager "
            "argument (EngineArgs)"
        )
    else:
        contexts = DECODE_CONTEXTS[:2] if args.quick else DECODE_CONTEXTS
        decode = decode_speed(
            contexts, args.decode_seqs, args.decode_tokens, args.repeats, args.threads
        )
        print_decode(decode, args.decode_seqs, args.decode_tokens)

    if args.json:
        g3_json = {k: v for k, v in g3.items() if k != "runs"}
        so_json = {k: so[k] for k in ("context_tokens", "kv_bytes_hybrid", "kv_bytes_full")}
        so_json.update({k: so[k] for k in ("peak_kv_bytes_hybrid", "peak_kv_bytes_full")})
        dec_json: dict[str, Any] | None = None
        if decode is not None:
            # The longest context's figures at the top level; every context below.
            top = max(decode["contexts"])
            h, f = decode["hybrid"][top], decode["full"][top]
            dec_json = {
                "hybrid": h["tokens_per_s"],
                "full": f["tokens_per_s"],
                "ratio": h["tokens_per_s"] / f["tokens_per_s"],
                "context_tokens": top,
                "by_context": {
                    str(c): {
                        "hybrid": decode["hybrid"][c]["tokens_per_s"],
                        "full": decode["full"][c]["tokens_per_s"],
                        "ratio": decode["hybrid"][c]["tokens_per_s"]
                        / decode["full"][c]["tokens_per_s"],
                        "hybrid_per_cpu_s": decode["hybrid"][c]["cpu_tokens_per_s"],
                        "full_per_cpu_s": decode["full"][c]["cpu_tokens_per_s"],
                    }
                    for c in decode["contexts"]
                },
                "num_seqs": args.decode_seqs,
                "max_tokens": args.decode_tokens,
                "threads": decode["threads"],
            }
        print(
            json.dumps(
                {"gemma3_like": g3_json, "sliding_only": so_json, "decode_tokens_per_s": dec_json}
            )
        )


if __name__ == "__main__":
    main()
