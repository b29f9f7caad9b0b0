"""Prometheus metrics of the server, in a registry of its own.

Gauges and engine counters are read from the engine's statistics at scrape
time; token counters and latency histograms are fed by an output listener on
the engine thread. Names follow vLLM's (``pagedrs:`` prefix, ``model_name``
label); the metrics vLLM also has are exported a second time under vLLM's own
``vllm:`` names (``VLLM_NAMES``), so a dashboard made for vLLM reads them.
Latencies are in seconds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ...engine.protocol import EngineClient
from ...outputs import RequestOutput

LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 320.0, 640.0,
)  # fmt: skip
TPOT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
    2.5, 5.0, 10.0,
)  # fmt: skip


#: Metrics exported under both ``pagedrs:<name>`` and ``vllm:<name>`` (vLLM's
#: v1 names; counters get prometheus' ``_total`` suffix in both).
VLLM_NAMES: frozenset[str] = frozenset(
    {
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage_perc",
        "num_preemptions",
        "prefix_cache_queries",
        "prefix_cache_hits",
        "prompt_tokens",
        "generation_tokens",
        "request_success",
        "time_to_first_token_seconds",
        "time_per_output_token_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
        "request_prefill_time_seconds",
        "spec_decode_num_drafts",
        "spec_decode_num_draft_tokens",
        "spec_decode_num_accepted_tokens",
        "spec_decode_num_accepted_tokens_per_pos",
    }
)


def _prefixes(name: str) -> tuple[str, ...]:
    return ("pagedrs", "vllm") if name in VLLM_NAMES else ("pagedrs",)


class _Both:
    """A prometheus_client metric under each of its names (``_prefixes``); its
    children update every copy."""

    def __init__(self, kind: Any, name: str, doc: str, labels: list[str], **kw: Any) -> None:
        self.copies = [kind(f"{p}:{name}", doc, labels, **kw) for p in _prefixes(name)]

    def labels(self, *values: str) -> _BothChild:
        return _BothChild([m.labels(*values) for m in self.copies])


class _BothChild:
    def __init__(self, children: list[Any]) -> None:
        self.children = children

    def inc(self, amount: float = 1.0) -> None:
        for c in self.children:
            c.inc(amount)

    def observe(self, value: float) -> None:
        for c in self.children:
            c.observe(value)


class EngineStatsCollector(Collector):
    """Gauges and counters from ``EngineClient.kv_cache_stats()`` at scrape time.

    Args:
        engine: the engine to read.
        model_name: value of the ``model_name`` label.
    """

    def __init__(self, engine: EngineClient, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name

    def _gauge(self, name: str, doc: str, value: float) -> Iterator[Metric]:
        for prefix in _prefixes(name):
            g = GaugeMetricFamily(f"{prefix}:{name}", doc, labels=["model_name"])
            g.add_metric([self.model_name], value)
            yield g

    def _counter(self, name: str, doc: str, value: float) -> Iterator[Metric]:
        for prefix in _prefixes(name):
            c = CounterMetricFamily(f"{prefix}:{name}", doc, labels=["model_name"])
            c.add_metric([self.model_name], value)
            yield c

    def collect(self) -> Iterator[Metric]:
        s = self.engine.kv_cache_stats()
        total = max(int(s.get("num_total_blocks", 0)), 1)
        used = int(s.get("num_used_blocks", 0))
        queries = int(s.get("prefix_cache_queries", 0))
        hits = int(s.get("prefix_cache_hits", 0))
        yield from self._gauge(
            "num_requests_running", "Sequences running.", s.get("num_running", 0)
        )
        yield from self._gauge(
            "num_requests_waiting", "Sequences waiting.", s.get("num_waiting", 0)
        )
        yield from self._gauge(
            "num_requests_swapped", "Sequences swapped out.", s.get("num_swapped", 0)
        )
        yield from self._gauge(
            "kv_cache_usage_perc", "Used device KV blocks / all (0-1).", used / total
        )
        yield from self._gauge(
            "kv_cache_utilization",
            "Token states stored / slots allocated in used blocks (0-1).",
            s.get("kv_cache_utilization", 1.0),
        )
        yield from self._gauge(
            "num_free_blocks", "Free device KV blocks.", s.get("num_free_blocks", 0)
        )
        yield from self._gauge("num_used_blocks", "Used device KV blocks.", used)
        yield from self._gauge(
            "num_total_blocks", "Device KV blocks.", s.get("num_total_blocks", 0)
        )
        yield from self._gauge(
            "num_cached_blocks", "Blocks in the prefix cache.", s.get("num_cached_blocks", 0)
        )
        yield from self._gauge(
            "prefix_cache_hit_rate",
            "Prompt tokens found in the prefix cache / prompt tokens looked up (0-1).",
            hits / queries if queries else 0.0,
        )
        yield from self._counter(
            "num_preemptions", "Sequences preempted.", s.get("num_preemptions", 0)
        )
        yield from self._counter("prefix_cache_queries", "Prompt tokens looked up.", queries)
        yield from self._counter("prefix_cache_hits", "Prompt tokens found cached.", hits)
        yield from self._counter("num_steps", "Engine steps.", s.get("num_steps", 0))
        yield from self._group_gauges(s.get("groups", ()))
        yield from self._cache_gauges(s)
        yield from self._spec_decode_counters(s)

    def _spec_decode_counters(self, s: dict[str, Any]) -> Iterator[Metric]:
        """Speculative decoding counters (vLLM's ``spec_decode_*`` names): the
        acceptance rate is accepted / draft tokens, the mean accepted length
        1 + accepted / drafts; per draft position (label ``position``,
        0-based) the drafts accepted there."""
        yield from self._counter(
            "spec_decode_num_drafts",
            "Sequence steps that carried draft tokens.",
            s.get("spec_decode_num_drafts", 0),
        )
        yield from self._counter(
            "spec_decode_num_draft_tokens",
            "Draft tokens proposed.",
            s.get("spec_decode_num_draft_tokens", 0),
        )
        yield from self._counter(
            "spec_decode_num_accepted_tokens",
            "Draft tokens accepted.",
            s.get("spec_decode_num_accepted_tokens", 0),
        )
        per_pos = list(s.get("spec_decode_num_accepted_tokens_per_pos", ()))
        name = "spec_decode_num_accepted_tokens_per_pos"
        for prefix in _prefixes(name):
            c = CounterMetricFamily(
                f"{prefix}:{name}",
                "Draft tokens accepted at each draft position.",
                labels=["model_name", "position"],
            )
            for pos, count in enumerate(per_pos):
                c.add_metric([self.model_name, str(pos)], count)
            yield c

    def _cache_gauges(self, s: dict[str, Any]) -> Iterator[Metric]:
        """The KV cache's bytes in its storage format (int8 scales included),
        and its configuration as an info gauge (value 1, labelled
        ``kv_cache_dtype`` and ``block_size``)."""
        per_block = int(s.get("bytes_per_block", 0))
        yield from self._gauge(
            "kv_cache_bytes_per_block",
            "Bytes one KV block costs across all layers and ranks, scales included.",
            per_block,
        )
        yield from self._gauge(
            "kv_cache_total_bytes",
            "Bytes of all device KV blocks (all ranks).",
            per_block * int(s.get("num_total_blocks", 0)),
        )
        yield from self._gauge(
            "kv_cache_used_bytes",
            "Bytes of the used device KV blocks (all ranks).",
            per_block * int(s.get("num_used_blocks", 0)),
        )
        yield from self._gauge(
            "kv_cache_free_bytes",
            "Bytes of the free device KV blocks (all ranks): the KV budget left.",
            per_block * int(s.get("num_free_blocks", 0)),
        )
        yield from self._gauge(
            "weight_bytes",
            "Bytes the model's weights hold in the engine process, quantized weights "
            "as stored, packed copies included.",
            int(s.get("weight_bytes", 0)),
        )
        if "lora_reserved_bytes" in s:  # LoRA (pagedrs.lora)
            yield from self._gauge(
                "lora_bytes",
                "Bytes the loaded LoRA adapters' float32 matrices hold, and their slots' copies.",
                int(s.get("lora_bytes", 0)) + int(s.get("lora_slot_bytes", 0)),
            )
            yield from self._gauge(
                "lora_reserved_bytes",
                "Bytes set aside from the KV cache budget for LoRA adapters (the most they "
                "may take: max_cpu_loras loaded + max_loras slots at max_lora_rank).",
                int(s["lora_reserved_bytes"]),
            )
        info = GaugeMetricFamily(
            "pagedrs:cache_config_info",
            "KV cache configuration (value 1).",
            labels=["model_name", "kv_cache_dtype", "block_size"],
        )
        info.add_metric(
            [self.model_name, str(s.get("kv_cache_dtype", "")), str(s.get("block_size", ""))], 1
        )
        yield info

    def _group_gauges(self, groups: list[dict[str, Any]]) -> Iterator[Metric]:
        """Per KV cache group gauges, labelled ``kv_cache_group`` (its index) and
        ``sliding_window`` (tokens, or "none" for full attention)."""
        labels = ["model_name", "kv_cache_group", "sliding_window"]
        families = {
            "num_used_blocks": GaugeMetricFamily(
                "pagedrs:kv_cache_group_used_blocks",
                "Device KV blocks held by the KV cache group.",
                labels=labels,
            ),
            "num_token_states": GaugeMetricFamily(
                "pagedrs:kv_cache_group_token_states",
                "Token states the KV cache group stores.",
                labels=labels,
            ),
            "num_allocated_slots": GaugeMetricFamily(
                "pagedrs:kv_cache_group_allocated_slots",
                "Token slots of the KV cache group's used blocks.",
                labels=labels,
            ),
            "kv_cache_utilization": GaugeMetricFamily(
                "pagedrs:kv_cache_group_utilization",
                "Token states stored / slots allocated in the group's used blocks (0-1).",
                labels=labels,
            ),
        }
        for index, group in enumerate(groups):
            window = group.get("sliding_window")
            values = [self.model_name, str(index), "none" if window is None else str(window)]
            for key, family in families.items():
                default = 1.0 if key == "kv_cache_utilization" else 0
                family.add_metric(values, group.get(key, default))
        if groups:
            yield from families.values()


class ServerMetrics:
    """The server's registry: engine gauges, token counters, latency histograms.

    Args:
        engine: the engine to observe (an output listener is added to it).
        model_name: value of the ``model_name`` label.
    """

    def __init__(self, engine: EngineClient, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        labels = ["model_name"]
        r = self.registry
        self.prompt_tokens = _Both(
            Counter, "prompt_tokens", "Prefill tokens processed.", labels, registry=r
        )
        self.generation_tokens = _Both(
            Counter, "generation_tokens", "Generation tokens produced.", labels, registry=r
        )
        self.request_success = _Both(
            Counter,
            "request_success",
            "Finished requests, by finish reason (abort: aborted or failed).",
            ["model_name", "finished_reason"],
            registry=r,
        )
        self.ttft = _Both(
            Histogram,
            "time_to_first_token_seconds",
            "Time to first token (s).",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = _Both(
            Histogram,
            "time_per_output_token_seconds",
            "Mean time per output token after the first (s).",
            labels,
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.e2e = _Both(
            Histogram,
            "e2e_request_latency_seconds",
            "End-to-end request latency (s).",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = _Both(
            Histogram,
            "request_queue_time_seconds",
            "Time from a request's arrival in the engine (tokenized) to the start of "
            "the step that first scheduled it (s).",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.prefill_time = _Both(
            Histogram,
            "request_prefill_time_seconds",
            "Time from the start of the step that first scheduled a request to its "
            "first token (s): every prefill chunk and the first sampling.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        r.register(EngineStatsCollector(engine, model_name))
        self._tokens_seen: dict[str, int] = {}
        self._lock = threading.Lock()
        engine.add_output_listener(self.observe)

    def observe(self, out: RequestOutput) -> None:
        """Account one output (engine thread): new tokens, first token, finish."""
        n = sum(len(c.token_ids) for c in out.outputs)
        name = self.model_name
        with self._lock:
            seen = self._tokens_seen.get(out.request_id)
            if out.finished:
                self._tokens_seen.pop(out.request_id, None)
            else:
                self._tokens_seen[out.request_id] = max(n, seen or 0)
        if n > (seen or 0):
            self.generation_tokens.labels(name).inc(n - (seen or 0))
        m = out.metrics
        if m is None:
            return
        if seen is None and m.first_token_time is not None:  # its first output
            self.prompt_tokens.labels(name).inc(len(out.prompt_token_ids))
            self.ttft.labels(name).observe(max(m.first_token_time - m.arrival_time, 0.0))
            if m.first_scheduled_time is not None:
                queued = m.first_scheduled_time - m.arrival_time
                self.queue_time.labels(name).observe(max(queued, 0.0))
                prefill = m.first_token_time - m.first_scheduled_time
                self.prefill_time.labels(name).observe(max(prefill, 0.0))
        if not out.finished:
            return
        reasons = {c.finish_reason for c in out.outputs} or {"abort"}
        reason = "abort" if "abort" in reasons else ("length" if "length" in reasons else "stop")
        self.request_success.labels(name, reason).inc()
        if m.finished_time is None:
            return
        self.e2e.labels(name).observe(max(m.finished_time - m.arrival_time, 0.0))
        longest = max((len(c.token_ids) for c in out.outputs), default=0)
        if m.first_token_time is not None and longest > 1:
            self.tpot.labels(name).observe(
                max(m.finished_time - m.first_token_time, 0.0) / (longest - 1)
            )

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
