"""Sampling parameters, named and validated as in vLLM's ``SamplingParams``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """How to sample one request's output.

    Attributes:
        n: number of output sequences per prompt (only 1 is supported so far).
        temperature: softmax temperature, >= 0; 0 means greedy.
        top_p: nucleus probability mass, in (0, 1].
        top_k: keep the k most likely tokens; 0 or -1 disables.
        seed: per-request seed; the same seed gives the same output whatever
            else is in the batch.
        max_tokens: most tokens to generate, >= 1.
        min_tokens: EOS / stop token ids are ignored before this many tokens.
        stop_token_ids: token ids that end generation (besides EOS).
        ignore_eos: keep generating past EOS.
        skip_special_tokens: drop special tokens from the output text.

    Raises:
        ValueError: on construction, naming the invalid field.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if self.n != 1:
            raise ValueError(f"n must be 1, got {self.n} (parallel sampling is not built yet)")
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disable), 0 (disable) or >= 1, got {self.top_k}")
        if isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.min_tokens < 0 or self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"
            )
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative, got {self.stop_token_ids}")
        self.stop_token_ids = list(self.stop_token_ids)

    @property
    def greedy(self) -> bool:
        """True when decoding is greedy (temperature 0)."""
        return self.temperature == 0.0
