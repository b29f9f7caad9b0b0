"""Throughput at a latency bound (the paper's main result, §6.2).

Normalized latency (mean over requests of end-to-end latency / output tokens,
s/token) against the request rate, on the ShareGPT-like and Alpaca-like traces
of ../shared/data, for three systems running the same float32 model on CPU:

  pagedrs            ``LLMEngine`` driven in-process: a request is added once its
                     Poisson arrival time has passed, the engine is stepped, and
                     each request's finish time is recorded.
  hf-generate        HF transformers static batching (FasterTransformer-like):
                     up to ``--hf-batch`` arrived requests, left-padded, run by
                     ``model.generate`` to the longest output of the batch; every
                     request of the batch finishes when the batch does, and
                     requests arriving meanwhile wait.
  hf-generate-batch  HF transformers continuous batching on its paged cache
                     (``init_continuous_batching``: the manager behind
                     ``generate_batch``), fed online with ``add_request`` at each
                     arrival, each request with its own ``max_new_tokens``.

Every system does identical work: the same prompts (chat template applied),
greedy decoding, end-of-sequence disabled, exactly the trace's output length
(capped by ``--max-output-tokens``). Every rate replays the same requests of a
trace with its own seeded Poisson arrivals. Latency runs from a request's
scheduled arrival to its last token, so queueing counts.

Reported: a table per trace and system; the highest request rate each system
sustains at ``--bound`` s/token (linear interpolation between swept rates; by
default the bound is ``--bound-factor`` times the lowest unloaded per-token
latency of any system, measured first with one request alone); the ratio
pagedrs / best HF system; offline throughput (all requests at t = 0, output
tokens/s); and how often pagedrs' greedy tokens equal HF's.

Ablations (pagedrs only, each its own flag, ``--ablations-only`` skips the rest):
``--ablate-prefix`` (1-shot / 5-shot Alpaca prefixes on every prompt, prefix
caching on vs off), ``--ablate-block-size`` (8 / 16 / 32), ``--ablate-preemption``
(swap vs recompute under a small KV budget, per block size; Alpaca-like requests
all at t = 0 by default, whose growth during decoding forces preemption). Block
size and preemption run with prefix caching off.

With ``--json`` the last line is one object: ``max_rate_at_bound`` ({system: req/s})
and ``ratio_pagedrs_over_best_hf`` of the primary (first) trace, both per trace under
``*_by_trace``, ``offline_tokens_per_s``,
``bound_s_per_token``, ``unloaded_s_per_token``, ``sweeps`` (trace -> system ->
one row per rate), ``greedy_agreement_with_pagedrs``, ``ablations``.

    python benches/bench_throughput.py [--num-requests 24] [--max-output-tokens 64]
        [--sharegpt-rates 0.5,1,2,4] [--alpaca-rates 1,2,4,8] [--systems ...]
        [--offline-requests 32] [--bound S | --bound-factor 4] [--threads N]
        [--ablate-prefix] [--ablate-block-size] [--ablate-preemption] [--ablations-only]
        [--plot PATH] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from common import (
    chat_prompt_ids,
    json_safe,
    load_trace,
    poisson_arrivals,
    print_table,
    read_data,
)

SYSTEMS = ("pagedrs", "hf-generate", "hf-generate-batch")
# The paper's Orca baselines as allocation policies of the same engine (§6): a
# contiguous reservation per request, token-granular (block size 1).
ORCA = {"orca-max": "reserve-max", "orca-pow2": "reserve-pow2", "orca-oracle": "reserve-oracle"}
TRACES = ("sharegpt", "alpaca")


@dataclass
class Req:
    """One request: prompt token ids and the exact number of tokens to generate."""

    rid: str
    prompt: list[int]
    output_len: int


@dataclass
class Run:
    """What one system did with one list of requests (times in s from the run's start)."""

    arrivals: list[float]
    finish: list[float]
    tokens: list[list[int]]
    batch_sizes: list[int] = field(default_factory=list)  # per decode step, where known
    extra: dict[str, Any] = field(default_factory=dict)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- systems


class Pagedrs:
    """pagedrs ``LLMEngine`` driven in-process under timed arrivals."""

    name = "pagedrs"

    def __init__(self, **engine_kwargs: Any) -> None:
        from pagedrs import LLMEngine
        from pagedrs.engine.arg_utils import EngineArgs

        self.engine = LLMEngine(EngineArgs(**engine_kwargs))
        self._runs = 0

    def run(self, reqs: list[Req], arrivals: list[float]) -> Run:
        from pagedrs import SamplingParams

        eng = self.engine
        self._runs += 1
        salt = f"run{self._runs}"  # no prefix-cache hits on blocks of earlier runs
        index = {r.rid: i for i, r in enumerate(reqs)}
        finish = [math.nan] * len(reqs)
        tokens: list[list[int]] = [[] for _ in reqs]
        batch: list[int] = []
        before = eng.kv_cache_stats()
        nxt = 0
        t0 = time.perf_counter()
        while nxt < len(reqs) or eng.has_unfinished_requests():
            now = time.perf_counter() - t0
            while nxt < len(reqs) and arrivals[nxt] <= now:
                r = reqs[nxt]
                params = SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True)
                eng.add_request(r.rid, r.prompt, params, cache_salt=salt)
                nxt += 1
            if not eng.has_unfinished_requests():
                time.sleep(max(0.0, arrivals[nxt] - (time.perf_counter() - t0)))
                continue
            outs = eng.step()
            done = time.perf_counter() - t0
            if outs:  # requests that got a token this step (partial prefill chunks excluded)
                batch.append(len(outs))
            for o in outs:
                if o.finished:
                    i = index[o.request_id]
                    finish[i] = done
                    tokens[i] = list(o.outputs[0].token_ids)
        after = eng.kv_cache_stats()
        extra = {
            k: after[k] - before[k]
            for k in (
                "num_preemptions",
                "num_swapped_out",
                "num_swapped_in",
                "prefix_cache_queries",
                "prefix_cache_hits",
            )
        }
        return Run(list(arrivals), finish, tokens, batch, extra)

    def close(self) -> None:
        self.engine.shutdown()


def load_hf_model(model_dir: str) -> Any:
    """The HF model in float32 with end-of-sequence disabled (greedy to max_new_tokens)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    # No EOS at all (rather than min_new_tokens, which would mask the EOS logit and so
    # change the argmax): the same tokens as pagedrs' ignore_eos.
    model.generation_config.eos_token_id = None
    return model


class HFGenerate:
    """HF static batching: ``model.generate`` over batches of arrived requests."""

    name = "hf-generate"

    def __init__(self, model: Any, batch: int, pad_id: int) -> None:
        self.model, self.batch, self.pad_id = model, batch, pad_id

    def run(self, reqs: list[Req], arrivals: list[float]) -> Run:
        finish = [math.nan] * len(reqs)
        tokens: list[list[int]] = [[] for _ in reqs]
        sizes: list[int] = []
        nxt = 0  # requests are served in arrival (= list) order
        t0 = time.perf_counter()
        while nxt < len(reqs):
            wait = arrivals[nxt] - (time.perf_counter() - t0)
            if wait > 0:
                time.sleep(wait)
            now = time.perf_counter() - t0
            idx = [i for i in range(nxt, min(nxt + self.batch, len(reqs))) if arrivals[i] <= now]
            nxt += len(idx)
            chunk = [reqs[i] for i in idx]
            width = max(len(r.prompt) for r in chunk)
            new = max(r.output_len for r in chunk)
            ids = torch.tensor([[self.pad_id] * (width - len(r.prompt)) + r.prompt for r in chunk])
            mask = torch.tensor(
                [[0] * (width - len(r.prompt)) + [1] * len(r.prompt) for r in chunk]
            )
            with torch.inference_mode():
                out = self.model.generate(
                    ids,
                    attention_mask=mask,
                    max_new_tokens=new,
                    do_sample=False,
                    pad_token_id=self.pad_id,
                )
            done = time.perf_counter() - t0
            sizes += [len(chunk)] * new
            for i, row in zip(idx, out[:, width:].tolist(), strict=True):
                if len(row) < reqs[i].output_len:
                    raise RuntimeError(
                        f"hf-generate stopped {reqs[i].rid} early: {len(row)} tokens"
                    )
                finish[i] = done
                tokens[i] = row[: reqs[i].output_len]
        return Run(list(arrivals), finish, tokens, sizes)

    def close(self) -> None:
        pass


class HFGenerateBatch:
    """HF continuous batching (paged cache), fed online through its manager."""

    name = "hf-generate-batch"

    def __init__(
        self, model: Any, page_size: int, max_batch_tokens: int, max_requests_per_batch: int
    ) -> None:
        self.model = model
        self.page_size = page_size
        self.max_batch_tokens = max_batch_tokens
        self.max_requests_per_batch = max_requests_per_batch

    def run(self, reqs: list[Req], arrivals: list[float]) -> Run:
        from transformers import GenerationConfig
        from transformers.generation import ContinuousBatchingConfig

        # The cache holds every request of the run at full length (pagedrs' 4 GiB
        # default holds far more), so nothing is ever evicted or offloaded.
        pages = sum(math.ceil((len(r.prompt) + r.output_len) / self.page_size) + 1 for r in reqs)
        cb = ContinuousBatchingConfig(
            page_size=self.page_size,
            num_blocks=pages + 8,
            max_batch_tokens=self.max_batch_tokens,
            max_requests_per_batch=self.max_requests_per_batch,
        )
        gen = GenerationConfig(do_sample=False, eos_token_id=-1)
        # A fresh manager (and cache) per run: no prefix sharing with earlier runs.
        mgr = self.model.init_continuous_batching(
            generation_config=gen, continuous_batching_config=cb
        )
        index = {r.rid: i for i, r in enumerate(reqs)}
        finish = [math.nan] * len(reqs)
        tokens: list[list[int]] = [[] for _ in reqs]
        left, nxt = len(reqs), 0
        mgr.start()
        try:
            t0 = time.perf_counter()
            while left:
                now = time.perf_counter() - t0
                while nxt < len(reqs) and arrivals[nxt] <= now:
                    r = reqs[nxt]
                    mgr.add_request(
                        r.prompt, request_id=r.rid, max_new_tokens=r.output_len, eos_token_id=-1
                    )
                    nxt += 1
                timeout = 1.0 if nxt == len(reqs) else max(1e-3, arrivals[nxt] - now)
                res = mgr.get_result(timeout=min(timeout, 1.0))
                if res is None:
                    if not mgr.is_running():
                        raise RuntimeError("HF continuous batching loop died (see its log)")
                    continue
                if not res.is_finished():
                    continue
                if res.error is not None:
                    raise RuntimeError(
                        f"HF continuous batching failed {res.request_id}: {res.error}"
                    )
                i = index[res.request_id]
                end = res.lifespan[1] if res.lifespan[1] > 0 else time.perf_counter()
                finish[i] = end - t0
                tokens[i] = list(res.generated_tokens)
                left -= 1
        finally:
            mgr.stop(block=True, timeout=30)
            mgr.destroy()
        return Run(list(arrivals), finish, tokens)

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- metrics


def summarize(run: Run, reqs: list[Req]) -> dict[str, Any]:
    """Latency and throughput of one run (latencies in s, normalized in s/token)."""
    lat = np.array([f - a for f, a in zip(run.finish, run.arrivals, strict=True)])
    outs = np.array([r.output_len for r in reqs])
    norm = lat / outs
    makespan = float(np.nanmax(run.finish)) if len(reqs) else math.nan
    counts_ok = all(len(t) == r.output_len for t, r in zip(run.tokens, reqs, strict=True))
    p50, p90 = np.percentile(norm, [50, 90])
    return {
        "num_requests": len(reqs),
        "normalized_latency_s_per_token": {
            "mean": float(norm.mean()),
            "p50": float(p50),
            "p90": float(p90),
        },
        "mean_latency_s": float(lat.mean()),
        "duration_s": makespan,
        "throughput_rps": len(reqs) / makespan,
        "output_tokens_per_s": float(outs.sum()) / makespan,
        "output_tokens": int(outs.sum()),
        "prompt_tokens": int(sum(len(r.prompt) for r in reqs)),
        "total_tokens_per_s": float(outs.sum() + sum(len(r.prompt) for r in reqs)) / makespan,
        "mean_batched_requests": float(np.mean(run.batch_sizes)) if run.batch_sizes else None,
        "token_counts_ok": counts_ok,
        **run.extra,
    }


def max_rate_at_bound(rates: list[float], lat: list[float], bound: float) -> tuple[float, str]:
    """Highest request rate whose mean normalized latency stays within ``bound``.

    Rates ascend. The first rate over the bound ends the search; the crossing is
    interpolated linearly from the rate before it. Returns the rate and a note:
    "" (interpolated), ">=" (never over the bound: at least the highest rate) or
    "<" (over it already at the lowest rate: 0 is returned).
    """
    for j, (r, x) in enumerate(zip(rates, lat, strict=True)):
        if x > bound:
            if j == 0:
                return 0.0, "<"
            r0, x0 = rates[j - 1], lat[j - 1]
            return r0 + (r - r0) * (bound - x0) / (x - x0), ""
    return rates[-1], ">="


def agreement(ref: list[list[int]], other: list[list[int]]) -> tuple[int, int, float]:
    """(requests equal, requests, mean fraction of tokens before the first difference)."""
    same, frac = 0, []
    for a, b in zip(ref, other, strict=True):
        same += a == b
        k = next(
            (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
        )
        frac.append(k / max(len(a), 1))
    return same, len(ref), float(np.mean(frac)) if frac else math.nan


# --------------------------------------------------------------------------- workloads


def trace_requests(
    dataset: str, tok: Any, n: int, max_output: int, max_prompt: int, seed: int, tag: str
) -> list[Req]:
    """``n`` requests drawn (seeded) from a trace; fewer when the trace has fewer."""
    trace = load_trace(dataset, tok, max_output, max_prompt)
    if n > len(trace):
        log(f"note: {dataset} has {len(trace)} usable requests (asked {n}); using all of them")
        n = len(trace)
    picked = random.Random(seed).sample(trace, n)
    return [
        Req(f"{tag}-{i}", chat_prompt_ids(tok, r.messages), r.output_len)
        for i, r in enumerate(picked)
    ]


def few_shot_prefix(tok: Any, shots: int) -> str:
    """A ``shots``-example prefix of short Alpaca instruction/response pairs (from the
    end of the file, ~50-110 tokens each, as the paper's ~80-token shots)."""
    records = read_data("alpaca_en_demo.json")
    picked = []
    for r in reversed(records):
        if r.get("input"):
            continue
        n = len(tok(r["instruction"] + r["output"]).input_ids)
        if 50 <= n <= 110:
            picked.append(r)
        if len(picked) == shots:
            break
    parts = ["Answer the last instruction the way the examples are answered.\n"]
    for r in picked:
        parts.append(f"### Instruction:\n{r['instruction']}\n### Response:\n{r['output']}\n")
    return "\n".join(parts) + "\n"


def prefixed_requests(tok: Any, base: list[Any], prefix: str, tag: str) -> list[Req]:
    return [
        Req(
            f"{tag}-{i}",
            chat_prompt_ids(
                tok,
                [{"role": "user", "content": f"{prefix}### Instruction:\n{m}\n### Response:\n"}],
            ),
            r.output_len,
        )
        for i, (r, m) in enumerate(base)
    ]


# --------------------------------------------------------------------------- runs


def sweep(
    runners: dict[str, Any], reqs: list[Req], rates: list[float], seed: int, label: str
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[list[list[int]]]]]:
    """Every system at every rate: rates outer, systems inner (so the systems of one
    rate run close together in time on a shared, noisy machine)."""
    rows: dict[str, list[dict[str, Any]]] = {s: [] for s in runners}
    tokens: dict[str, list[list[list[int]]]] = {s: [] for s in runners}
    for k, rate in enumerate(rates):
        arrivals = poisson_arrivals(len(reqs), rate, seed + k)
        for s, system in runners.items():
            t = time.perf_counter()
            run = system.run(reqs, arrivals)
            row = {"request_rate": rate, **summarize(run, reqs)}
            rows[s].append(row)
            tokens[s].append(run.tokens)
            log(
                f"  {label} {s} rate {rate:g}: norm latency "
                f"{row['normalized_latency_s_per_token']['mean']:.3f} s/token, "
                f"{row['output_tokens_per_s']:.1f} tok/s ({time.perf_counter() - t:.0f} s)"
            )
    return rows, tokens


def unloaded_latency(system: Any, req: Req, repeats: int = 2) -> float:
    """Lowest normalized latency (s/token) of ``req`` run alone, over ``repeats`` runs."""
    best = math.inf
    for _ in range(repeats):
        run = system.run([req], [0.0])
        best = min(best, run.finish[0] / req.output_len)
    return best


def ablation_table(title: str, rows: list[dict[str, Any]], keys: list[str]) -> None:
    print_table(
        title,
        [*keys, "norm lat mean", "p90", "tok/s", "req/s", "batch", "preempt", "cache hit %"],
        [
            [
                *[r[k] for k in keys],
                r["normalized_latency_s_per_token"]["mean"],
                r["normalized_latency_s_per_token"]["p90"],
                r["output_tokens_per_s"],
                r["throughput_rps"],
                r["mean_batched_requests"] or math.nan,
                r["num_preemptions"],
                100.0 * r["prefix_cache_hits"] / max(r["prefix_cache_queries"], 1),
            ]
            for r in rows
        ],
    )


def run_ablations(args: argparse.Namespace, tok: Any) -> dict[str, Any]:
    """The paper's ablations on pagedrs alone; one fresh engine per configuration."""
    out: dict[str, Any] = {}
    common = {"model": args.model, "max_model_len": args.max_model_len}

    def fresh(**kw: Any) -> Pagedrs:
        gc.collect()
        eng = Pagedrs(**{**common, **kw})
        eng.run([Req("warm", [1, 2, 3, 4], 2)], [0.0])
        return eng

    if args.ablate_prefix:
        base_trace = load_trace("alpaca", tok, args.max_output_tokens, args.max_prompt_tokens)
        picked = random.Random(args.seed + 7).sample(base_trace, args.ablation_requests)
        base = [(r, r.messages[0]["content"]) for r in picked]
        rows = []
        for shots in (1, 5):
            prefix = few_shot_prefix(tok, shots)
            reqs = prefixed_requests(tok, base, prefix, f"prefix{shots}")
            plen = len(chat_prompt_ids(tok, [{"role": "user", "content": prefix}]))
            for caching in (True, False):
                eng = fresh(enable_prefix_caching=caching)
                arr = poisson_arrivals(len(reqs), args.ablation_rate, args.seed + 100)
                row = summarize(eng.run(reqs, arr), reqs)
                row.update(shots=shots, prefix_tokens=plen, prefix_caching=caching)
                rows.append(row)
                eng.close()
                del eng
                log(f"  prefix {shots}-shot caching={caching}: done")
        ablation_table(
            f"Shared prefix (Alpaca + k-shot prefix, {args.ablation_requests} requests, "
            f"{args.ablation_rate:g} req/s)",
            rows,
            ["shots", "prefix_tokens", "prefix_caching"],
        )
        out["shared_prefix"] = rows

    # Block size and preemption run without prefix caching, as in the paper: hits on
    # the chat template's shared system prompt would depend on the block size, and a
    # recomputed request would find its own freed blocks still cached.
    if args.ablate_block_size:
        rows = []
        for dataset in TRACES:
            reqs = trace_requests(
                dataset,
                tok,
                args.ablation_requests,
                args.max_output_tokens,
                args.max_prompt_tokens,
                args.seed,
                f"bs-{dataset}",
            )
            for bs in (8, 16, 32):
                eng = fresh(block_size=bs, enable_prefix_caching=False)
                arr = poisson_arrivals(len(reqs), args.ablation_rate, args.seed + 200)
                row = summarize(eng.run(reqs, arr), reqs)
                row.update(trace=dataset, block_size=bs)
                rows.append(row)
                eng.close()
                del eng
                log(f"  block size {dataset} {bs}: done")
        ablation_table(
            f"Block size ({args.ablation_requests} requests per trace, "
            f"{args.ablation_rate:g} req/s)",
            rows,
            ["trace", "block_size"],
        )
        out["block_size"] = rows

    if args.ablate_preemption:
        reqs = trace_requests(
            args.preempt_trace,
            tok,
            args.ablation_requests,
            args.max_output_tokens,
            args.max_prompt_tokens,
            args.seed,
            "preempt",
        )
        longest = max(len(r.prompt) + r.output_len for r in reqs)
        kv_tokens = max(args.preempt_kv_tokens, longest + 32)
        rows = []
        for bs in (8, 16, 32):
            for mode in ("recompute", "swap"):
                eng = fresh(
                    block_size=bs,
                    num_gpu_blocks_override=kv_tokens // bs,
                    preemption_mode=mode,
                    enable_prefix_caching=False,  # recompute really recomputes
                    max_model_len=longest + 1,
                    swap_space=1.0,
                )
                arr = poisson_arrivals(len(reqs), args.preempt_rate, args.seed + 300)
                row = summarize(eng.run(reqs, arr), reqs)
                row.update(block_size=bs, mode=mode, kv_tokens=kv_tokens // bs * bs)
                rows.append(row)
                eng.close()
                del eng
                log(f"  preemption bs {bs} {mode}: done")
        ablation_table(
            f"Preemption under a {kv_tokens}-token KV budget ({args.preempt_trace}, "
            f"{args.ablation_requests} requests, rate {args.preempt_rate:g})",
            rows,
            ["block_size", "mode"],
        )
        print_table(
            "Preemption: blocks moved",
            ["block_size", "mode", "preemptions", "swapped out", "swapped in"],
            [
                [
                    r["block_size"],
                    r["mode"],
                    r["num_preemptions"],
                    r["num_swapped_out"],
                    r["num_swapped_in"],
                ]
                for r in rows
            ],
        )
        if not any(r["num_preemptions"] for r in rows):
            print(
                "  no request was preempted: lower --preempt-kv-tokens, or raise "
                "--ablation-requests / --max-output-tokens"
            )
        out["preemption"] = rows
    return out


def plot(sweeps: dict[str, Any], bound: float, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sweeps), figsize=(6 * len(sweeps), 4.2), squeeze=False)
    for ax, (trace, systems) in zip(axes[0], sweeps.items(), strict=True):
        for name, rows in systems.items():
            ax.plot(
                [r["request_rate"] for r in rows],
                [r["normalized_latency_s_per_token"]["mean"] for r in rows],
                "o-",
                label=name,
            )
        ax.axhline(bound, color="gray", ls="--", label=f"bound {bound:.3f} s/token")
        ax.set(xlabel="request rate (req/s)", ylabel="normalized latency (s/token)", title=trace)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- main


def parse_rates(s: str) -> list[float]:
    rates = sorted(float(x) for x in s.split(",") if x.strip())
    if not rates or any(not (r > 0) or not math.isfinite(r) for r in rates):
        raise SystemExit(f"rates must be positive and finite: {s!r}")
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="alias or HF folder")
    ap.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated, of {', '.join(SYSTEMS + tuple(ORCA))}",
    )
    ap.add_argument("--traces", default=",".join(TRACES), help="comma-separated subset")
    ap.add_argument("--num-requests", type=int, default=24, help="requests per rate")
    ap.add_argument("--sharegpt-rates", default="0.5,1,2,4", help="req/s, comma-separated")
    ap.add_argument("--alpaca-rates", default="1,2,4,8", help="req/s, comma-separated")
    ap.add_argument("--max-output-tokens", type=int, default=64, help="cap of output lengths")
    ap.add_argument("--max-prompt-tokens", type=int, default=512, help="longer prompts are skipped")
    ap.add_argument("--max-model-len", type=int, default=2048, help="of the pagedrs engines")
    ap.add_argument(
        "--offline-requests", type=int, default=32, help="ShareGPT requests at t=0; 0 skips"
    )
    ap.add_argument(
        "--bound", type=float, default=None, help="s/token (default: see --bound-factor)"
    )
    ap.add_argument(
        "--bound-factor",
        type=float,
        default=4.0,
        help="bound = this x the lowest unloaded per-token latency of any system",
    )
    ap.add_argument(
        "--kv-tokens",
        type=int,
        default=None,
        help="KV budget (token slots) of pagedrs and the orca-* systems (default: 4 GiB)",
    )
    ap.add_argument("--hf-batch", type=int, default=16, help="hf-generate static batch size")
    ap.add_argument("--hf-page-size", type=int, default=256, help="hf-generate-batch page size")
    ap.add_argument(
        "--hf-max-batch-tokens", type=int, default=2048, help="hf-generate-batch token budget"
    )
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ablate-prefix", action="store_true", help="shared-prefix ablation")
    ap.add_argument("--ablate-block-size", action="store_true", help="block size 8/16/32")
    ap.add_argument("--ablate-preemption", action="store_true", help="swap vs recompute")
    ap.add_argument("--ablations-only", action="store_true", help="skip sweeps and offline")
    ap.add_argument("--ablation-requests", type=int, default=24)
    ap.add_argument("--ablation-rate", type=float, default=2.0, help="req/s of ablation runs")
    ap.add_argument(
        "--preempt-rate", type=float, default=math.inf, help="req/s of the preemption runs"
    )
    ap.add_argument(
        "--preempt-kv-tokens", type=int, default=1024, help="KV budget (tokens) for preemption"
    )
    ap.add_argument("--preempt-trace", default="alpaca", choices=TRACES)
    ap.add_argument("--plot", default=None, help="PNG of normalized latency vs rate")
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    args = ap.parse_args()

    systems = [s for s in args.systems.split(",") if s]
    traces = [t for t in args.traces.split(",") if t]
    for s in systems:
        if s not in SYSTEMS and s not in ORCA:
            raise SystemExit(f"unknown system {s!r}: {', '.join(SYSTEMS + tuple(ORCA))}")
    for t in traces:
        if t not in TRACES:
            raise SystemExit(f"unknown trace {t!r}: {', '.join(TRACES)}")
    rates = {"sharegpt": parse_rates(args.sharegpt_rates), "alpaca": parse_rates(args.alpaca_rates)}

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)

    from pagedrs.executor.model_loader import hf_folder
    from transformers import AutoTokenizer

    model_dir = str(hf_folder(args.model))
    tok = AutoTokenizer.from_pretrained(model_dir)
    t_start = time.perf_counter()
    result: dict[str, Any] = {
        "benchmark": "bench_throughput",
        "model": args.model,
        "threads": args.threads,
        "num_requests_per_rate": args.num_requests,
        "max_output_tokens": args.max_output_tokens,
        "max_prompt_tokens": args.max_prompt_tokens,
    }

    if not args.ablations_only and systems:
        runners: dict[str, Any] = {}
        hf_model = None
        for s in systems:
            if s == "pagedrs":
                kv = {}
                if args.kv_tokens:
                    kv = {"num_gpu_blocks_override": args.kv_tokens // 16}
                runners[s] = Pagedrs(model=args.model, max_model_len=args.max_model_len, **kv)
            elif s in ORCA:
                runners[s] = Pagedrs(
                    model=args.model,
                    max_model_len=args.max_model_len,
                    block_size=1,
                    allocation_policy=ORCA[s],
                    enable_prefix_caching=False,
                    num_gpu_blocks_override=args.kv_tokens or None,
                )
            else:
                if hf_model is None:
                    hf_model = load_hf_model(model_dir)
                if s == "hf-generate":
                    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
                    runners[s] = HFGenerate(hf_model, args.hf_batch, pad)
                else:
                    runners[s] = HFGenerateBatch(
                        hf_model, args.hf_page_size, args.hf_max_batch_tokens, 256
                    )

        workloads = {
            t: trace_requests(
                t,
                tok,
                args.num_requests,
                args.max_output_tokens,
                args.max_prompt_tokens,
                args.seed,
                t,
            )
            for t in traces
        }
        # Calibration (and warm-up): one request alone, the ShareGPT request with
        # the median prompt, generating --max-output-tokens tokens.
        calib_src = trace_requests(
            "sharegpt", tok, 64, args.max_output_tokens, args.max_prompt_tokens, args.seed, "cal"
        )
        calib_src.sort(key=lambda r: len(r.prompt))
        med = calib_src[len(calib_src) // 2]
        calib = Req("calib", med.prompt, args.max_output_tokens)
        unloaded = {}
        for s, sysm in runners.items():
            sysm.run([Req("warm", calib.prompt[:16], 4)], [0.0])
            unloaded[s] = unloaded_latency(sysm, calib)
        if args.bound is not None:
            bound, how = args.bound, "given by --bound"
        else:
            best = min(unloaded, key=unloaded.get)
            bound = args.bound_factor * unloaded[best]
            how = (
                f"{args.bound_factor:g} x the lowest unloaded normalized latency "
                f"({best}: {unloaded[best]:.4f} s/token, one {len(calib.prompt)}-token prompt, "
                f"{calib.output_len} output tokens, best of 2)"
            )
        print_table(
            "Unloaded normalized latency (one request alone, s/token)",
            ["system", "s/token"],
            [[s, v] for s, v in unloaded.items()],
        )
        print(f"\nbound: {bound:.4f} s/token = {how}")
        result.update(
            bound_s_per_token=bound, bound_how=how, unloaded_s_per_token=unloaded, sweeps={}
        )

        sweeps: dict[str, dict[str, list[dict[str, Any]]]] = {}
        toks: dict[str, dict[str, list[list[list[int]]]]] = {}
        for t in traces:
            reqs = workloads[t]
            sweeps[t], toks[t] = sweep(runners, reqs, rates[t], args.seed, t)
        result["sweeps"] = sweeps

        max_rate: dict[str, dict[str, float]] = {}
        ratio: dict[str, float] = {}
        censored: dict[str, dict[str, str | None]] = {}
        for t in traces:
            reqs = workloads[t]
            mp = np.mean([len(r.prompt) for r in reqs])
            mo = np.mean([r.output_len for r in reqs])
            rows = []
            max_rate[t] = {}
            notes = {}
            for s, srows in sweeps[t].items():
                lat = [r["normalized_latency_s_per_token"]["mean"] for r in srows]
                mr, note = max_rate_at_bound(rates[t], lat, bound)
                max_rate[t][s], notes[s] = mr, note
                censored.setdefault(t, {})[s] = {"<": "below", ">=": "above"}.get(note)
                for r in srows:
                    rows.append(
                        [
                            s,
                            r["request_rate"],
                            r["normalized_latency_s_per_token"]["mean"],
                            r["normalized_latency_s_per_token"]["p50"],
                            r["normalized_latency_s_per_token"]["p90"],
                            r["throughput_rps"],
                            r["output_tokens_per_s"],
                            r["mean_batched_requests"] or math.nan,
                            "yes" if r["token_counts_ok"] else "NO",
                        ]
                    )
            print_table(
                f"{t}: {len(reqs)} requests per rate, mean prompt {mp:.0f} / output {mo:.0f} "
                f"tokens, normalized latency in s/token",
                [
                    "system",
                    "rate",
                    "norm mean",
                    "p50",
                    "p90",
                    "req/s",
                    "tok/s",
                    "batch",
                    "counts ok",
                ],
                rows,
            )
            print(f"\n{t}: highest rate at normalized latency <= {bound:.4f} s/token")
            for s, mr in max_rate[t].items():
                note = {
                    "<": f"  (over the bound at {rates[t][0]:g} req/s already)",
                    ">=": "  (within the bound at every swept rate: a lower limit)",
                }.get(notes[s], "")
                print(f"  {s:18s} {mr:.2f} req/s{note}")
            hf = {s: v for s, v in max_rate[t].items() if s.startswith("hf-")}
            if "pagedrs" in max_rate[t] and hf:
                best_hf = max(hf, key=hf.get)
                if hf[best_hf] > 0:
                    ratio[t] = max_rate[t]["pagedrs"] / hf[best_hf]
                    hint = {
                        (True, False): " (a lower limit: pagedrs met the bound at every rate)",
                        (False, True): f" (an upper limit: {best_hf} met the bound at every rate)",
                        (True, True): " (undetermined: both met the bound at every rate)",
                    }.get((notes["pagedrs"] == ">=", notes[best_hf] == ">="), "")
                    print(f"  ratio pagedrs / best HF ({best_hf}): {ratio[t]:.2f}x{hint}")
                else:
                    ratio[t] = math.nan  # JSON null: no HF system met the bound
                    print("  ratio pagedrs / best HF: n/a (no HF system met the bound)")
        # The schema: one flat {system: req/s} for the primary (first) trace;
        # every trace under *_by_trace.
        primary = traces[0] if traces else None
        result["primary_trace"] = primary
        result["max_rate_at_bound"] = max_rate.get(primary, {})
        result["ratio_pagedrs_over_best_hf"] = ratio.get(primary, math.nan)
        result["max_rate_at_bound_by_trace"] = max_rate
        result["max_rate_at_bound_censored"] = censored
        result["ratio_pagedrs_over_best_hf_by_trace"] = ratio

        offline: dict[str, float] = {}
        offline_total: dict[str, float] = {}
        off_toks: dict[str, list[list[int]]] = {}
        if args.offline_requests > 0:
            oreqs = trace_requests(
                "sharegpt",
                tok,
                args.offline_requests,
                args.max_output_tokens,
                args.max_prompt_tokens,
                args.seed + 1,
                "offline",
            )
            rows = []
            for s, sysm in runners.items():
                run = sysm.run(oreqs, [0.0] * len(oreqs))
                summ = summarize(run, oreqs)
                offline[s] = summ["output_tokens_per_s"]
                offline_total[s] = summ["total_tokens_per_s"]
                off_toks[s] = run.tokens
                rows.append(
                    [
                        s,
                        summ["prompt_tokens"],
                        summ["output_tokens"],
                        summ["duration_s"],
                        offline[s],
                        offline_total[s],
                        "yes" if summ["token_counts_ok"] else "NO",
                    ]
                )
                log(f"  offline {s}: {offline[s]:.1f} tok/s")
            print_table(
                f"Offline throughput: {len(oreqs)} ShareGPT-like requests at t=0, outputs <= "
                f"{args.max_output_tokens} tokens",
                [
                    "system",
                    "prompt tokens",
                    "output tokens",
                    "seconds",
                    "output tok/s",
                    "total tok/s",
                    "counts ok",
                ],
                rows,
            )
            if "pagedrs" in offline:
                for s, v in offline.items():
                    if s != "pagedrs":
                        print(f"  ratio pagedrs / {s}: {offline['pagedrs'] / v:.2f}x")
        result["offline_tokens_per_s"] = offline
        result["offline_total_tokens_per_s"] = offline_total
        result["offline_requests"] = len(off_toks.get(systems[0], []))

        # Greedy agreement of each HF system with pagedrs, over every run of both.
        agree = {}
        if "pagedrs" in runners:
            for s in runners:
                if s == "pagedrs":
                    continue
                same = total = 0
                fracs = []
                pairs = [(toks[t]["pagedrs"], toks[t][s]) for t in traces]
                if off_toks:
                    pairs.append(([off_toks["pagedrs"]], [off_toks[s]]))
                for ref_runs, oth_runs in pairs:
                    for ref, oth in zip(ref_runs, oth_runs, strict=True):
                        a, n, f = agreement(ref, oth)
                        same, total = same + a, total + n
                        fracs.append(f)
                agree[s] = {
                    "requests_identical": same,
                    "requests": total,
                    "identical_rate": same / max(total, 1),
                    "mean_prefix_match": float(np.mean(fracs)),
                }
            print_table(
                "Greedy agreement with pagedrs (same prompt, same output length)",
                ["system", "identical requests", "of", "rate", "mean matching prefix"],
                [
                    [
                        s,
                        a["requests_identical"],
                        a["requests"],
                        a["identical_rate"],
                        a["mean_prefix_match"],
                    ]
                    for s, a in agree.items()
                ],
            )
        result["greedy_agreement_with_pagedrs"] = agree
        counts_ok = all(
            r["token_counts_ok"] for t in sweeps for rows_ in sweeps[t].values() for r in rows_
        )
        result["token_counts_ok"] = counts_ok
        print(f"\nevery request got exactly its output length in every system: {counts_ok}")

        if args.plot:
            plot(sweeps, bound, args.plot, f"{args.model}, {args.threads} threads, CPU float32")
            print(f"plot: {args.plot}")
        for sysm in runners.values():
            sysm.close()
        del runners, hf_model
        gc.collect()

    if args.ablate_prefix or args.ablate_block_size or args.ablate_preemption:
        result["ablations"] = run_ablations(args, tok)
    else:
        result["ablations"] = {}
    result["wall_s"] = time.perf_counter() - t_start
    print(f"\ntotal wall time: {result['wall_s']:.0f} s")
    if args.json:
        print(json.dumps(json_safe(result)))


if __name__ == "__main__":
    main()
