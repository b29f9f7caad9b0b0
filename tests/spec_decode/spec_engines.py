"""The speculative decoding tests' engines, prompts and probes: the default
model loaded from its GGUF file (Q4_1), whose projections run the Rust
quantized kernels (integer sums: a row's logits are the same bits alone, in
any batch, in a prefill chunk or decoded; checked in
``test_batch_invariance.py``), so greedy and seeded outputs with speculation
must equal those without it, token for token."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from model_files import SMOLLM2_GGUF, gguf_file
from pagedrs import LLM

MAX_MODEL_LEN = 160
#: Every proposal drafted in full ("fixed"): the tests of the machinery see
#: drafts of every length at every batch size, whatever the machine's timings
#: (``test_draft_policy.py`` tests the goodput policy with given step costs).
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
         "prompt_lookup_max": 4, "draft_length_policy": "fixed"}  # fmt: skip
SUFFIX = {"method": "suffix", "num_speculative_tokens": 6, "draft_length_policy": "fixed"}

#: Prompts that quote their input (long drafts accepted), plain ones (few), a
#: prompt past the stress engines' token budget (chunked prefill), and one that
#: reaches max_model_len within its output.
PROMPTS = [
    "Repeat the list exactly.\nList: apples, pears, plums, cherries, grapes, lemons, limes.\n"
    "Repeated list: apples,",
    "Rename the variable x to total and print the new code.\n\ndef add(a, b):\n    x = a + b\n"
    "    return x\n\nNew code:\ndef add(a, b):\n",
    "Copy this sentence: The paged attention kernel reads each block once per tile.\nCopy:",
    "Name three rivers.",
    "1 2 3 4 5 6 7",
    "Hi",
    "Write a long story about a dragon who learns to code in Rust and Python, with many "
    "details about the journey, the friends it makes, the bugs it fixes, and the mountains "
    "it flies over on the way to the conference.",
    "Count: " + ", ".join(str(i) for i in range(1, 40)),  # ~140 tokens: max_model_len
]


def engine(speculative_config: dict[str, Any] | None = None, **kwargs: Any) -> LLM:
    """The GGUF default model on CPU with the tests' context length."""
    base: dict[str, Any] = {
        "kv_cache_memory_bytes": 96 << 20,
        "max_model_len": MAX_MODEL_LEN,
        "seed": 0,
    }
    base.update(kwargs)
    return LLM(str(smol_gguf()), speculative_config=speculative_config, **base)


def smol_gguf() -> Path:
    """The default model's GGUF file in pagedrs' cache (``model_files``)."""
    return gguf_file(SMOLLM2_GGUF)


class DraftLog:
    """Each step's draft count per sampled sequence, read from the batches
    the executor runs."""

    def __init__(self, llm: LLM) -> None:
        self.steps: list[dict[int, int]] = []
        runner = llm.llm_engine.engine_core.runner
        inner: Callable[..., Any] = runner.execute

        def execute(batch: Any, extra_rows: Any = None) -> Any:
            ids = batch.sample_request_ids.tolist()
            self.steps.append(dict(zip(ids, batch.num_draft_tokens.tolist(), strict=True)))
            return inner(batch, extra_rows)

        runner.execute = execute  # type: ignore[method-assign]

    def per_sequence(self) -> dict[int, list[int]]:
        """Draft counts of each sequence's steps, in order."""
        out: dict[int, list[int]] = {}
        for step in self.steps:
            for sid, d in step.items():
                out.setdefault(sid, []).append(d)
        return out


def spec_stats(llm: LLM) -> dict[str, Any]:
    s = llm.llm_engine.kv_cache_stats()
    return {k: v for k, v in s.items() if k.startswith("spec_decode")}
