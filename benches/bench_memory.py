"""Where the KV cache memory goes under each allocation policy (paper §2.3, Fig. 2).

One trace (ShareGPT-like and Alpaca-like, from ../shared/data, token lengths from
the default model's tokenizer) runs through the real Rust scheduler
(``pagedrs._core.Scheduler``) under a fixed KV budget with each allocation policy.
No model runs: every sampled token is a dummy id, there are no stop tokens, and
each request gets ``max_tokens`` = its reference output length (capped so prompt +
output <= max_model_len), so it finishes exactly there.

Policies (``allocation_policy`` of the scheduler):

* ``paged-8/16/32``: PagedAttention, blocks of 8/16/32 slots allocated on demand
  (vLLM); a request that needs a block when none is free is preempted (recompute).
* ``orca-max``: Orca (Max), each request reserves one contiguous run for
  max_model_len tokens at admission.
* ``orca-pow2``: Orca (Pow2), prompt + next power of two of the output length.
* ``orca-oracle``: Orca (Oracle), prompt + exactly the output length
  (``expected_output_len`` = the reference output length).
* ``static``: static batching (FasterTransformer-style), reserves like Orca (Max);
  a new batch is admitted only when the whole previous batch has finished.

The reserving policies use block size 1 (a block is a token slot) and first-fit
contiguous runs over free slot ids, so external fragmentation really arises.
Prefix caching is off everywhere.

Setting, mirroring the paper's (LLaMA-13B on an A100-40GB): one token's KV
states take 2 (K, V) x 40 layers x 5120 hidden x 2 bytes (fp16) = 819,200 bytes
(the paper's "800 KB"); the paper's Fig. 1 gives the KV cache about 30% of the
40 GB (26 GB of weights, a few % of activations), 12 GB, so the budget is
S = 12e9 / 819,200 = 14,648 token slots (paged: the whole blocks that fit in S).
max_model_len 2048, max_num_seqs 256, token budget 16384 per step (more than S,
so admission is limited by memory only), chunked prefill on. Every request
arrives at time 0, so memory is the limit.

Shares, measured right after each ``schedule()`` (the memory the step's forward
pass runs with), as fractions of the S slots (``Scheduler.memory_breakdown()``):

* token_states: slots holding KV states of tokens in the cache (computed ones
  plus those the step writes);
* reservation: allocated slots that a later token of the same request will fill;
* internal: allocated slots that will never hold a token: past the request's
  final KV length (prompt + output - 1; the last sampled token is never fed
  back). Orca (Max)/static: max_model_len past it; Pow2: the rounding up (and
  one slot); Oracle: one slot; paged: the unused tail of the final block;
* external: free slots that no request can use at this step. Under a reserving
  policy a running request never takes another slot, so free slots only serve
  admissions; they are external at a step where the head of the waiting queue
  (first come, first served: nobody jumps it) was not admitted because no free
  contiguous run is as long as its reservation, or (static batching) because
  its batch is still running. Paged has none: any free block serves any
  request's next block;
* free: the remaining free slots (so the five sum to exactly 1).

Averages are over the steps at which requests are still waiting after the
step's admissions (the memory-bound regime, as in a loaded server), not the
final drain. mean_batch is the mean number of running requests over the same
steps. "steps" is the number of engine iterations to finish the whole trace
(fewer = more throughput at equal step cost).

Hybrid KV cache (``kv_cache_groups`` of the scheduler): the same trace and the
same bytes as paged-16's pool, for a model whose layers mix attention types: 5
sliding-window : 1 full-attention (Gemma-3-like layer mix), with LLaMA-13B's KV
bytes per token (819,200) split over the layers in that ratio (40 layers do not
split 5:1, so the layer count is idealized; the result depends only on the byte
split and the budget). Layers are grouped vLLM-style into KV cache groups of
equal page size: 6 groups, ``kv_cache_groups=[None, W, W, W, W, W]``, one shared
pool of 16-slot blocks, each block holding 1/6 of the layers, so the pool has
6 x 915 = 5,490 blocks. Each sequence has a block table per group; the sliding
groups release the blocks behind the window at once. Windows: W = 512 and
256 (``--windows``; Gemma-3's own 1024 saves little at max_model_len 2048).
Shares are fractions of the same bytes as the other rows: every block has the
same bytes, and ``memory_breakdown()`` sums, over the groups, the positions of
the blocks each holds, over 5,490 x 16 slots. "behind window" is the part of
the token states that no query of the step or later sees (a sliding group holds
the block that straddles the window's start whole: under 16 positions per
sequence and sliding group). ``hybrid-16-all-full`` is the same 6-group layout
with every group full attention (``[None] * 6``): a sanity row that must equal
paged-16 exactly (checked, printed and in the JSON). Each row averages over its
own memory-bound steps (fewer in the sliding rows: more requests fit).

KV cache dtype (``--kv-cache-dtypes``): paged-16 on the same 12 GB with the KV
states stored as each ``kv_cache_dtype`` (LLaMA-13B: 40 layers x 40 KV heads
of 128; bytes per token from ``KVCacheSpec.bytes_per_block`` at block size 1,
int8's per-token, per-head bfloat16 scales included: fp16 ("auto") 819,200,
fp8 409,600, int8 416,000), so the pool holds ``12e9 // bytes`` slots.

Bound check (paper §4.3): for paged, waste is under one block per sequence, so
internal / allocated < block_size / T with T the trace's mean final sequence
length; printed and in the JSON, with (internal + reservation) / allocated too.

    python benches/bench_memory.py [--json] [--plot benches/results/memory.png]
        [--traces sharegpt alpaca] [--prompt-format raw|chat] [--max-requests N]
        [--windows 512 256]

``--prompt-format raw`` (default) counts a prompt as the tokens of its messages'
text (as the paper's dataset statistics do); ``chat`` applies the model's chat
template (what the engine would actually run).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import load_trace, print_table
from pagedrs._core import Scheduler
from pagedrs.attention.kv_cache_dtype import KV_CACHE_DTYPES
from pagedrs.executor.kv_cache import KVCacheSpec


def kv_bytes_per_token(kv_cache_dtype: str = "auto") -> int:
    """Bytes of one token's KV states of LLaMA-13B (fp16 weights) stored as
    ``kv_cache_dtype``, all layers, scales included."""
    spec = KVCacheSpec(40, 40, 128, 1, torch.float16, kv_cache_dtype=kv_cache_dtype)
    return spec.bytes_per_block


# LLaMA-13B on an A100-40GB (see the module docstring).
KV_BYTES_PER_TOKEN = kv_bytes_per_token()  # 2 * 40 * 5120 * 2
KV_CACHE_BYTES = 0.30 * 40e9
KV_SLOTS = int(KV_CACHE_BYTES // KV_BYTES_PER_TOKEN)  # 14,648
MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 256
TOKEN_BUDGET = 16384
DUMMY_TOKEN = 100

# name -> (allocation_policy, block size)
POLICIES: dict[str, tuple[str, int]] = {
    "orca-max": ("reserve-max", 1),
    "orca-pow2": ("reserve-pow2", 1),
    "orca-oracle": ("reserve-oracle", 1),
    "static": ("static", 1),
    "paged-8": ("paged", 8),
    "paged-16": ("paged", 16),
    "paged-32": ("paged", 32),
}
SHARES = ("token_states", "reservation", "internal", "external", "free")

# Hybrid KV cache (see the module docstring): paged-16 blocks, 5 sliding-window
# groups per full-attention group, each group 1/6 of the layers.
HYBRID_BLOCK_SIZE = 16
HYBRID_SLIDING_PER_FULL = 5
HYBRID_WINDOWS = (512, 256)
HYBRID_NUM_GROUPS = 1 + HYBRID_SLIDING_PER_FULL
# Fields that must match paged-16 exactly in the all-full 6-group layout.
SANITY_KEYS = (*SHARES, "mean_batch", "steps", "memory_bound_steps", "preemptions")


def hybrid_groups(window: int | None) -> list[int | None]:
    """kv_cache_groups of the 5:1 layer mix (window None: every group full)."""
    return [None] + [window] * HYBRID_SLIDING_PER_FULL


# The paper's figures (Fig. 2: % of KV memory holding token states; §6.2:
# mean batched requests, OPT-13B on ShareGPT).
PAPER_TOKEN_STATES = {"orca-max": "20.4-38.2", "orca-pow2": "20.4-38.2", "orca-oracle": "20.4-38.2"}
PAPER_TOKEN_STATES.update({"paged-16": "96.3"})
PAPER_MEAN_BATCH = {"orca-max": 7.00, "orca-oracle": 13.62, "paged-16": 30.42}
PAPER_TRACE = {"sharegpt": (161, 338), "alpaca": (19, 58)}


def trace_lengths(
    dataset: str, tokenizer: Any, prompt_format: str, max_requests: int | None
) -> tuple[list[list[int]], list[int]]:
    """(prompt token ids, output lengths) of a data set, output capped so that
    prompt + output <= max_model_len."""
    trace = load_trace(dataset, tokenizer, MAX_MODEL_LEN, 1024)[:max_requests]
    prompts = []
    for r in trace:
        if prompt_format == "chat":
            text = tokenizer.apply_chat_template(
                r.messages, tokenize=False, add_generation_prompt=True
            )
            ids = tokenizer(text, add_special_tokens=False).input_ids
        else:
            ids = [t for m in r.messages for t in tokenizer(m["content"]).input_ids]
        prompts.append(list(ids))
    outs = [min(r.output_len, MAX_MODEL_LEN - len(p)) for r, p in zip(trace, prompts, strict=True)]
    return prompts, outs


def simulate(
    policy: str,
    block_size: int,
    prompts: list[list[int]],
    outs: list[int],
    slots: int = KV_SLOTS,
    max_model_len: int = MAX_MODEL_LEN,
    max_num_seqs: int = MAX_NUM_SEQS,
    token_budget: int = TOKEN_BUDGET,
    kv_cache_groups: list[int | None] | None = None,
) -> dict[str, Any]:
    """Run every request (all arriving at step 0) to its output length under
    ``policy``; return the mean shares and batch size over memory-bound steps.

    With ``kv_cache_groups`` (G groups), the pool has G x (slots // block_size)
    blocks, each of 1/G of a one-group block's bytes: the same bytes."""
    num_groups = len(kv_cache_groups) if kv_cache_groups else 1
    num_blocks = num_groups * (slots // block_size)
    windows = [w for w in kv_cache_groups or [] if w is not None]
    sched = Scheduler(
        num_blocks,
        block_size,
        max_num_seqs,
        token_budget,
        max_model_len,
        enable_chunked_prefill=True,
        enable_prefix_caching=False,
        allocation_policy=policy,
        kv_cache_groups=kv_cache_groups,
    )
    for i, (p, n_out) in enumerate(zip(prompts, outs, strict=True)):
        sched.add_request(i, np.asarray(p, dtype=np.int64), n_out, [], expected_output_len=n_out)
    sums = dict.fromkeys(SHARES, 0)
    running = measured = steps = behind = 0
    total = num_blocks * block_size
    t0 = time.perf_counter()
    while sched.has_unfinished_requests():
        out = sched.schedule()
        if out is None:
            raise RuntimeError(f"{policy}: requests left but nothing can run")
        steps += 1
        m = sched.memory_breakdown()
        if m.num_waiting > 0:
            measured += 1
            running += m.num_running
            for k in SHARES:
                sums[k] += getattr(m, k)
            if windows:
                behind += behind_window(out.batch, m.num_running, windows, block_size)
        sched.update(np.full(out.batch.num_sampled_tokens, DUMMY_TOKEN, dtype=np.int64))
    seconds = time.perf_counter() - t0
    stats = sched.stats()
    assert stats.num_free_blocks == stats.num_total_blocks, "blocks leaked"
    denom = max(measured, 1) * total
    res: dict[str, Any] = {k: sums[k] / denom for k in SHARES}
    if windows:
        res["behind_window"] = behind / denom
    allocated = sums["token_states"] + sums["reservation"] + sums["internal"]
    res.update(
        mean_batch=running / max(measured, 1),
        internal_of_allocated=sums["internal"] / max(allocated, 1),
        waste_of_allocated=(sums["internal"] + sums["reservation"]) / max(allocated, 1),
        slots=total,
        block_size=block_size,
        num_blocks=num_blocks,
        steps=steps,
        memory_bound_steps=measured,
        preemptions=stats.num_preemptions,
        seconds=seconds,
    )
    return res


def behind_window(batch: Any, num_running: int, windows: list[int], block_size: int) -> int:
    """Slots of the sliding groups holding KV states that no query of this step
    or later sees: a sequence with ``c`` tokens computed before the step has
    released the blocks wholly before position ``c + 1 - w``, and still holds
    the positions of the straddling block before it."""
    if batch.num_seqs != num_running:
        raise RuntimeError("a running sequence was not scheduled: behind_window needs them all")
    computed = batch.seq_lens.astype(np.int64) - np.diff(batch.query_start_loc).astype(np.int64)
    n = 0
    for w in windows:
        start = np.maximum(computed + 1 - w, 0)
        n += int((start % block_size).sum())
    return n


def run_hybrid(
    prompts: list[list[int]], outs: list[int], windows: list[int]
) -> dict[str, dict[str, Any]]:
    """The all-full 6-group sanity row and one 5:1 hybrid row per window."""
    rows = {"hybrid-16-all-full": hybrid_groups(None)}
    rows.update({f"hybrid-16-w{w}": hybrid_groups(w) for w in windows})
    res = {}
    for n, groups in rows.items():
        res[n] = simulate("paged", HYBRID_BLOCK_SIZE, prompts, outs, kv_cache_groups=groups)
        res[n]["kv_cache_groups"] = groups
    return res


def run_kv_dtypes(
    prompts: list[list[int]], outs: list[int], dtypes: list[str]
) -> dict[str, dict[str, Any]]:
    """paged-16 with the KV budget's slots for each KV cache dtype."""
    res = {}
    for kv in dtypes:
        per_token = kv_bytes_per_token(kv)
        slots = int(KV_CACHE_BYTES // per_token)
        res[kv] = simulate("paged", 16, prompts, outs, slots=slots)
        res[kv]["bytes_per_token"] = per_token
    return res


def print_kv_dtypes(name: str, rows: dict[str, dict[str, Any]]) -> None:
    print_table(
        f"KV cache dtype, {name}: paged-16 on {KV_CACHE_BYTES / 1e9:.0f} GB of LLaMA-13B KV "
        "states (bytes per token with scales), mean over memory-bound steps",
        ["kv_cache_dtype", "bytes/token", "slots", "mean batch", "steps", "preempt"],
        [
            [kv, r["bytes_per_token"], r["slots"], r["mean_batch"], r["steps"], r["preemptions"]]
            for kv, r in rows.items()
        ],
    )


def run_trace(
    prompts: list[list[int]], outs: list[int], names: list[str], windows: list[int] | None = None
) -> dict[str, Any]:
    """Every policy of ``names`` on one trace, with the trace's statistics and
    the paged bound check; with ``windows``, the hybrid rows and their sanity
    check against paged-16."""
    mean_p = float(np.mean([len(p) for p in prompts]))
    mean_o = float(np.mean(outs))
    mean_len = mean_p + mean_o
    policies = {n: simulate(POLICIES[n][0], POLICIES[n][1], prompts, outs) for n in names}
    bound = {}
    for n, r in policies.items():
        if POLICIES[n][0] == "paged":
            b = r["block_size"] / mean_len
            bound[n] = {
                "internal_of_allocated": r["internal_of_allocated"],
                "waste_of_allocated": r["waste_of_allocated"],
                "bound": b,
                "internal_ok": r["internal_of_allocated"] < b,
                "waste_ok": r["waste_of_allocated"] < b,
            }
    res = {
        "num_requests": len(prompts),
        "mean_prompt": mean_p,
        "mean_output": mean_o,
        "mean_seq_len": mean_len,
        "policies": policies,
        "bound": bound,
    }
    if windows is not None:
        hybrid = run_hybrid(prompts, outs, windows)
        res["hybrid"] = hybrid
        if "paged-16" in policies:
            ref, full = policies["paged-16"], hybrid["hybrid-16-all-full"]
            diff = [k for k in SANITY_KEYS if full[k] != ref[k]]
            res["hybrid_sanity"] = {"all_full_equals_paged_16": not diff, "differing": diff}
    return res


def print_trace(name: str, t: dict[str, Any]) -> None:
    rows = []
    for n, r in t["policies"].items():
        rows.append(
            [n]
            + [100 * r[k] for k in SHARES]
            + [
                PAPER_TOKEN_STATES.get(n, "-") if name == "sharegpt" else "-",
                r["mean_batch"],
                PAPER_MEAN_BATCH.get(n, "-") if name == "sharegpt" else "-",
                r["steps"],
                r["preemptions"],
                r["seconds"],
            ]
        )
    paper_p, paper_o = PAPER_TRACE[name]
    print_table(
        f"KV memory, {name}: {t['num_requests']} requests, mean prompt {t['mean_prompt']:.0f} / "
        f"output {t['mean_output']:.0f} tokens (paper: {paper_p} / {paper_o}); "
        f"% of {KV_SLOTS} slots, mean over memory-bound steps",
        [
            "policy",
            "tokens %",
            "reserv %",
            "internal %",
            "external %",
            "free %",
            "paper tokens %",
            "batch",
            "paper batch",
            "steps",
            "preempt",
            "seconds",
        ],
        rows,
    )
    if "static" in t["policies"]:
        print("(static: external also counts free slots idle until the running batch ends)")
    if "hybrid" in t:
        print_hybrid(name, t)
    brow = [
        [
            n,
            f"{100 * b['internal_of_allocated']:.3f}",
            f"{100 * b['waste_of_allocated']:.3f}",
            f"{100 * b['bound']:.3f}",
            "yes" if b["internal_ok"] else "NO",
            "yes" if b["waste_ok"] else "NO",
        ]
        for n, b in t["bound"].items()
    ]
    print_table(
        f"Paged bound, {name}: waste / allocated < block_size / T, T = {t['mean_seq_len']:.0f}",
        ["policy", "internal %", "internal+reserv %", "bound %", "internal ok", "all ok"],
        brow,
    )


def print_hybrid(name: str, t: dict[str, Any]) -> None:
    """The hybrid rows beside paged-16 (same bytes, same trace)."""
    ref = t["policies"].get("paged-16")
    rows = []
    for n, r in [*([("paged-16", ref)] if ref else []), *t["hybrid"].items()]:
        rows.append(
            [n, str(r.get("kv_cache_groups", "-")).replace(" ", ""), 100 * r["token_states"]]
            + [100 * r["behind_window"] if "behind_window" in r else "-"]
            + [100 * r[k] for k in SHARES[1:]]
            + [
                r["mean_batch"],
                f"{r['mean_batch'] / ref['mean_batch']:.2f}x" if ref else "-",
                r["steps"],
                r["preemptions"],
                r["seconds"],
            ]
        )
    print_table(
        f"Hybrid KV cache, {name}: 5 sliding : 1 full layers (Gemma-3-like mix, LLaMA-13B KV "
        f"bytes per token), paged-16, {HYBRID_NUM_GROUPS} groups in one pool of "
        f"{HYBRID_NUM_GROUPS} x {KV_SLOTS // HYBRID_BLOCK_SIZE} blocks (paged-16's bytes); "
        "% of the bytes, mean over memory-bound steps",
        [
            "policy",
            "kv_cache_groups",
            "tokens %",
            "behind window %",
            "reserv %",
            "internal %",
            "external %",
            "free %",
            "batch",
            "batch / paged-16",
            "steps",
            "preempt",
            "seconds",
        ],
        rows,
    )
    if "hybrid_sanity" in t:
        s = t["hybrid_sanity"]
        verdict = "yes" if s["all_full_equals_paged_16"] else f"NO ({', '.join(s['differing'])})"
        print(f"hybrid-16-all-full equals paged-16: {verdict}")


def plot(traces: dict[str, dict[str, Any]], path: Path) -> None:
    """Stacked bars of the five shares, one panel per trace."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {
        "token_states": "#4c9a2a",
        "reservation": "#f2b134",
        "internal": "#d9534f",
        "external": "#6f42c1",
        "free": "#cccccc",
    }
    fig, axes = plt.subplots(1, len(traces), figsize=(6.5 * len(traces), 5), squeeze=False)
    for ax, (name, t) in zip(axes[0], traces.items(), strict=True):
        rows = {**t["policies"], **t.get("hybrid", {})}
        names = list(rows)
        bottom = np.zeros(len(names))
        for k in SHARES:
            vals = np.array([100 * rows[n][k] for n in names])
            ax.bar(names, vals, bottom=bottom, color=colors[k], label=k.replace("_", " "))
            bottom += vals
        for i, n in enumerate(names):
            share = 100 * rows[n]["token_states"]
            ax.text(i, 101, f"{share:.1f}", ha="center", fontsize=8)
        ax.set_title(
            f"{name}: prompt {t['mean_prompt']:.0f} / output {t['mean_output']:.0f} tokens, "
            f"{KV_SLOTS} slots"
        )
        ax.set_ylabel("% of KV cache memory")
        ax.set_ylim(0, 108)
        ax.tick_params(axis="x", rotation=30)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(SHARES), fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def load_tokenizer() -> Any:
    from pagedrs.executor.model_registry import DEFAULT_MODEL, converted_dir
    from transformers import AutoTokenizer

    folder = converted_dir(DEFAULT_MODEL)
    if not (folder / "tokenizer.json").exists():
        from pagedrs.executor.model_loader import hf_folder

        folder = hf_folder(DEFAULT_MODEL)
    return AutoTokenizer.from_pretrained(folder)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--traces", nargs="+", default=["sharegpt", "alpaca"])
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    ap.add_argument("--prompt-format", choices=["raw", "chat"], default="raw")
    ap.add_argument("--max-requests", type=int, default=None, help="first N requests only")
    ap.add_argument("--plot", type=Path, default=None, help="write the stacked bars to this PNG")
    ap.add_argument(
        "--windows",
        nargs="*",
        type=int,
        default=list(HYBRID_WINDOWS),
        help="sliding windows (tokens) of the hybrid 5:1 rows; none: no hybrid rows",
    )
    ap.add_argument(
        "--kv-cache-dtypes",
        nargs="*",
        default=["auto", "fp8", "int8"],
        choices=KV_CACHE_DTYPES,
        help="paged-16 rows with the KV states stored as each; none: no such rows",
    )
    ap.add_argument("--json", action="store_true", help="one JSON object as the last line")
    args = ap.parse_args()

    tok = load_tokenizer()
    traces = {}
    for name in args.traces:
        prompts, outs = trace_lengths(name, tok, args.prompt_format, args.max_requests)
        traces[name] = run_trace(prompts, outs, args.policies, args.windows or None)
        print_trace(name, traces[name])
        if args.kv_cache_dtypes:
            traces[name]["kv_cache_dtypes"] = run_kv_dtypes(prompts, outs, args.kv_cache_dtypes)
            print_kv_dtypes(name, traces[name]["kv_cache_dtypes"])
    if args.plot is not None:
        try:
            plot(traces, args.plot)
            print(f"\nplot: {args.plot}")
        except ImportError:
            print('\nno plot: matplotlib is missing (pip install ".[bench]")')
    if args.json:
        keep = (*SHARES, "mean_batch", "steps", "preemptions", "memory_bound_steps")
        hkeep = (*keep, "behind_window", "kv_cache_groups", "num_blocks")
        slim = {
            name: {
                **{k: t[k] for k in ("num_requests", "mean_prompt", "mean_output", "mean_seq_len")},
                "policies": {n: {k: r[k] for k in keep} for n, r in t["policies"].items()},
                "bound": t["bound"],
                **(
                    {
                        "hybrid": {
                            n: {k: r[k] for k in hkeep if k in r} for n, r in t["hybrid"].items()
                        }
                    }
                    if "hybrid" in t
                    else {}
                ),
                **({"hybrid_sanity": t["hybrid_sanity"]} if "hybrid_sanity" in t else {}),
                "kv_cache_dtypes": {
                    kv: {k: r[k] for k in (*keep, "bytes_per_token", "slots")}
                    for kv, r in t.get("kv_cache_dtypes", {}).items()
                },
            }
            for name, t in traces.items()
        }
        default = "sharegpt" if "sharegpt" in slim else next(iter(slim))
        print(
            json.dumps(
                {
                    "trace": default,
                    "policies": slim[default]["policies"],
                    "bound": slim[default]["bound"],
                    "hybrid": slim[default].get("hybrid", {}),
                    "hybrid_sanity": slim[default].get("hybrid_sanity"),
                    "kv_cache_dtypes": slim[default]["kv_cache_dtypes"],
                    "traces": slim,
                    "setting": {
                        "kv_slots": KV_SLOTS,
                        "kv_bytes_per_token": KV_BYTES_PER_TOKEN,
                        "max_model_len": MAX_MODEL_LEN,
                        "max_num_seqs": MAX_NUM_SEQS,
                        "token_budget": TOKEN_BUDGET,
                        "prompt_format": args.prompt_format,
                        "hybrid": {
                            "layer_mix": f"{HYBRID_SLIDING_PER_FULL} sliding : 1 full",
                            "block_size": HYBRID_BLOCK_SIZE,
                            "num_blocks": HYBRID_NUM_GROUPS * (KV_SLOTS // HYBRID_BLOCK_SIZE),
                            "block_bytes_of_paged_16": f"1/{HYBRID_NUM_GROUPS}",
                            "windows": args.windows,
                        },
                    },
                    "paper": {
                        "token_states_pct": PAPER_TOKEN_STATES,
                        "mean_batch": PAPER_MEAN_BATCH,
                    },
                }
            )
        )


if __name__ == "__main__":
    main()
