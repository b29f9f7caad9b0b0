"""``speculative_config``: vLLM's dict of speculative decoding settings, given
as a dict (Python) or a JSON object (``--speculative-config``), checked by the
Rust core's ``check_speculative_config`` (each error names its field); and
which requests run without speculation."""

from __future__ import annotations

import json
from typing import Any

from .. import _core
from ..sampling_params import SamplingParams

#: vLLM's methods that need a second model (a draft model, EAGLE heads,
#: Medusa heads, MTP layers): not built in pagedrs, refused by name.
UNBUILT_METHODS: frozenset[str] = frozenset(
    {"draft_model", "eagle", "eagle3", "medusa", "mlp_speculator", "mtp", "deepseek_mtp"}
)


def parse_speculative_config(value: dict[str, Any] | str | None) -> dict[str, Any] | None:
    """The speculative decoding settings in force, or None when off.

    Args:
        value: a dict of vLLM's field names (``method`` "ngram" or "suffix",
            ``num_speculative_tokens``, ``prompt_lookup_min``,
            ``prompt_lookup_max``, ``suffix_decoding_max_tree_depth``,
            ``suffix_decoding_max_spec_factor``,
            ``suffix_decoding_min_token_prob``,
            ``suffix_decoding_max_cached_requests``), its JSON text, or None.
    Returns:
        every field with its value (vLLM's defaults for the absent ones).
    Raises:
        ValueError: text that is not a JSON object, a method that needs a
            second model (``draft_model``, ``eagle``, ...: not built), or a
            bad field (the message names it: ``speculative_config.<field>``).
    """
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"speculative_config is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError(
            f"speculative_config must be a JSON object (a dict), got {type(value).__name__}"
        )
    method = value.get("method")
    if isinstance(method, str) and method in UNBUILT_METHODS:
        raise ValueError(
            f"speculative_config.method {method!r} is not built in pagedrs: it needs a second "
            "model; the proposers are 'ngram' and 'suffix'"
        )
    if value.get("model") is not None:
        raise ValueError(
            f"speculative_config.model ({value['model']!r}) is not supported: draft models are "
            "not built in pagedrs; use method 'ngram' or 'suffix' without a model"
        )
    return _core.check_speculative_config({k: v for k, v in value.items() if k != "model"})


def speculation_off_reason(params: SamplingParams) -> str | None:
    """Why a sampling request runs without speculation, or None when it
    speculates. Requests speculation does not cover run as without it:

    * ``n`` or ``best_of`` > 1: the group's first step samples every
      sequence at once, and its sequences then decode on their own;
      speculation is off for every sequence of the request.
    * structured outputs: a grammar would have to take the drafts and roll
      back the rejected ones.

    Penalties, ``min_tokens``, logprobs and seeds are covered: each draft
    position is sampled with the settings and context a step without
    speculation would have (``verify``).
    """
    if (params.best_of or params.n) > 1:
        return "n > 1"
    if params.structured_outputs is not None:
        return "structured outputs"
    return None
