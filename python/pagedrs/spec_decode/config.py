"""``speculative_config``: vLLM's dict of speculative decoding settings, given
as a dict (Python) or a JSON object (``--speculative-config``), checked by the
Rust core's ``check_speculative_config`` (each error names its field); and
which requests run without speculation."""

from __future__ import annotations

import json
from typing import Any

import pagedrs._core as _core

from ..sampling_params import SamplingParams

#: vLLM's methods that need heads or layers trained for the target (EAGLE
#: heads, Medusa heads, MTP layers): not built in pagedrs, refused by name.
UNBUILT_METHODS: frozenset[str] = frozenset(
    {"eagle", "eagle3", "medusa", "mlp_speculator", "mtp", "deepseek_mtp"}
)

#: The method whose drafts come from a second model (``model``).
DRAFT_MODEL = "draft_model"


def parse_speculative_config(value: dict[str, Any] | str | None) -> dict[str, Any] | None:
    """The speculative decoding settings in force, or None when off.

    Args:
        value: a dict of vLLM's field names (``method`` "ngram", "suffix"
            or "draft_model", ``model`` (draft_model: the draft model's path
            or id, required; the other methods take none),
            ``num_speculative_tokens`` (required for draft_model),
            ``prompt_lookup_min``,
            ``prompt_lookup_max``, ``suffix_decoding_max_tree_depth``,
            ``suffix_decoding_max_spec_factor``,
            ``suffix_decoding_min_token_prob``,
            ``suffix_decoding_max_cached_requests``), its JSON text, or None.
    Returns:
        every field with its value (vLLM's defaults for the absent ones);
        for draft_model, ``model`` too.
    Raises:
        ValueError: text that is not a JSON object, a method that needs
            trained heads (``eagle``, ``medusa``, ...: not built), draft_model
            without ``model``, a ``model`` with another method, or a bad
            field (the message names it: ``speculative_config.<field>``).
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
    model = value.get("model")
    if method == DRAFT_MODEL:
        if not isinstance(model, str) or not model:
            raise ValueError(
                "speculative_config.model is required for method 'draft_model' (the draft "
                f"model's path or id, a string), got {model!r}"
            )
    elif model is not None:
        raise ValueError(
            f"speculative_config.model ({model!r}) is not supported for method {method!r}: "
            "only method 'draft_model' takes a model"
        )
    checked = _core.check_speculative_config({k: v for k, v in value.items() if k != "model"})
    if method == DRAFT_MODEL:
        checked["model"] = model
    return checked


def speculation_off_reason(params: SamplingParams) -> str | None:
    """Why a sampling request runs without speculation, or None when it
    speculates. Requests speculation does not cover run as without it:

    * ``n`` or ``best_of`` > 1: the group's first step samples every
      sequence at once, and its sequences then decode on their own;
      speculation is off for every sequence of the request.

    Penalties, ``min_tokens``, logprobs and seeds are covered: each draft
    position is sampled with the settings and context a step without
    speculation would have (``verify``); so are structured outputs: each
    draft position's row is masked by the grammar's state after the drafts
    before it (``structured_output.StructuredOutputManager.start_fill``).
    """
    if (params.best_of or params.n) > 1:
        return "n > 1"
    return None
