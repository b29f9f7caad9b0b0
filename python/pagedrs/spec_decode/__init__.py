"""Speculative decoding, the engine side: ``speculative_config`` parsing
(``config``), the verify step's sampling rows and the acceptance rule
(``verify``), the draft model's proposer (``draft_model``) and Leviathan et
al.'s rejection rule (``rejection``). The proposers ``ngram`` and ``suffix``
and the KV bookkeeping of draft tokens live in the Rust core
(``rust/pagedrs-sched/src/spec_decode``, ``rust/pagedrs-sched/src/scheduler/speculation.rs``);
see docs/speculative_decoding.md."""

from .config import (
    DRAFT_MODEL,
    UNBUILT_METHODS,
    parse_speculative_config,
    speculation_off_reason,
)

__all__ = [
    "DRAFT_MODEL",
    "UNBUILT_METHODS",
    "parse_speculative_config",
    "speculation_off_reason",
]
