"""``EngineClient``: what the OpenAI-compatible server needs of an engine.

Implementations: ``AsyncLLM`` (the engine core in its own process, the
server's default, or on a thread of this one) and ``serve.ReplicaPoolClient``
(replicas on Ray Serve).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from ..inputs import PromptType
from ..lora.request import LoRARequest
from ..outputs import RequestOutput
from ..sampling_params import BeamSearchParams, SamplingParams


class EngineClient(Protocol):
    """An asyncio engine: requests in, cumulative ``RequestOutput`` objects out."""

    tokenizer: Any
    max_model_len: int
    max_waiting_requests: int

    @property
    def is_running(self) -> bool: ...

    @property
    def max_num_seqs(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    def add_output_listener(self, listener: Callable[[RequestOutput], None]) -> None: ...

    def kv_cache_stats(self) -> dict[str, Any]: ...

    def num_waiting_requests(self) -> int: ...

    def check_priority(self, priority: int) -> None: ...

    async def check_health(self) -> None: ...

    def generate(
        self,
        prompt: PromptType,
        sampling_params: SamplingParams | BeamSearchParams,
        request_id: str,
        *,
        cache_salt: str | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput]: ...

    async def abort(self, request_id: str) -> None: ...

    async def reset_prefix_cache(self) -> bool: ...

    def shutdown(self, timeout: float | None = 60.0) -> None: ...
