"""Sampling parameters, named and validated as in vLLM's ``SamplingParams``."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field, fields
from typing import Any, TypeGuard

from .engine.core.errors import InvalidRequestError


def _check(cond: bool, name: str, rule: str, value: object) -> None:
    """Raise ``InvalidRequestError`` naming the field (its top-level name as
    ``param``) unless ``cond``."""
    if not cond:
        param = None if "." in name else name
        raise InvalidRequestError(f"{name} must be {rule}, got {value!r}", param=param)


def _check_positive_int(value: object, name: str) -> None:
    """``_check`` that the field ``name`` is an integer >= 1."""
    _check(_is_int(value) and value >= 1, name, "an integer >= 1", value)


_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass
class StructuredOutputsParams:
    """Constrain a request's output to a JSON schema, a regex, a choice or a
    grammar (vLLM's ``StructuredOutputsParams``; enforced with xgrammar token
    bitmasks, see ``pagedrs.structured_output``).

    Plain data only (str, bool, list, dict, None), so that ``SamplingParams``
    serializes field by field; compiled grammars and matcher state live in the
    engine. Exactly one of ``json``, ``regex``, ``choice``, ``grammar``,
    ``json_object`` is set.

    Attributes:
        json: a JSON schema, as a dict or a JSON string; the output is JSON
            valid against it (properties not in the schema are not generated).
        regex: the output matches this regular expression in full.
        choice: the output is exactly one of these strings.
        grammar: an EBNF (GBNF) grammar with a ``root`` rule.
        json_object: the output is a JSON object (any keys).
        structural_tag: an xgrammar structural tag (vLLM's field), as a dict
            or JSON text: ``{"type": "structural_tag", "format": {...}}``, e.g.
            free text in which each tool call after its trigger (hermes'
            ``<tool_call>``) is held to its function's schema.
        disable_any_whitespace: JSON without free whitespace (the fixed
            separators ``", "`` and ``": "``); ignored by the other kinds.
        whitespace_pattern: vLLM's field; xgrammar has no whitespace regex, so
            setting it raises ``ValueError`` (use ``disable_any_whitespace``).
        reasoning_end: the constraint applies after this text (a reasoning
            model's ``"</think>"``): the output is free text that does not
            contain it, then it, then the constrained answer. The server sets
            it from ``--reasoning-parser``, as vLLM's structured outputs start
            when its reasoning parser sees the reasoning end.
        reasoning_optional: the free text and ``reasoning_end`` may also be
            absent, the output then being the answer alone (``qwen3``, whose
            replies without a think block are all answer). Needs ``reasoning_end``.
        jump_forward: where the grammar leaves exactly one possible text (a
            forced function name, a schema's keys and punctuation), that text
            joins the output at once, written as the tokenizer's own tokens of
            it (jump-forward decoding, ``structured_output.jump_forward``):
            re-tokenized, the output gives back the tokens generated, so a
            conversation that sends it back finds it in the prefix cache. The
            text is any the grammar allows, as without it; the tokens differ.
            Forced tokens have logprob 0 (the grammar leaves no other text).

    Raises:
        ValueError: none or several kinds set, a wrong type, an empty regex,
            grammar or choice list, or a ``json`` string that is not JSON. A
            well-formed value that is not a valid schema, regex or grammar is
            refused when the request is added.
    """

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict[str, Any] | None = None
    disable_any_whitespace: bool = False
    whitespace_pattern: str | None = None
    reasoning_end: str | None = None
    reasoning_optional: bool = False
    jump_forward: bool = False

    def __post_init__(self) -> None:
        name = "structured_outputs"
        _check(
            self.reasoning_end is None
            or (isinstance(self.reasoning_end, str) and self.reasoning_end != ""),
            f"{name}.reasoning_end",
            "None or a non-empty string",
            self.reasoning_end,
        )
        _check(
            isinstance(self.reasoning_optional, bool)
            and (self.reasoning_end is not None or not self.reasoning_optional),
            f"{name}.reasoning_optional",
            "a bool, true only with reasoning_end",
            self.reasoning_optional,
        )
        _check(
            self.json is None or isinstance(self.json, (str, dict)),
            f"{name}.json",
            "a JSON schema (a dict or a JSON string)",
            self.json,
        )
        if isinstance(self.json, str):
            try:
                parsed = json.loads(self.json)
            except ValueError as exc:
                raise ValueError(f"{name}.json is not valid JSON: {exc}") from None
            _check(isinstance(parsed, dict), f"{name}.json", "a JSON schema object", self.json)
        for key in ("regex", "grammar"):
            v = getattr(self, key)
            _check(
                v is None or (isinstance(v, str) and v != ""),
                f"{name}.{key}",
                "a non-empty string",
                v,
            )
        if isinstance(self.choice, tuple):
            self.choice = list(self.choice)
        choices_ok = isinstance(self.choice, list) and all(isinstance(c, str) for c in self.choice)
        _check(
            self.choice is None or (choices_ok and len(self.choice) > 0),
            f"{name}.choice",
            "a non-empty list of strings",
            self.choice,
        )
        _check(
            self.structural_tag is None or isinstance(self.structural_tag, (str, dict)),
            f"{name}.structural_tag",
            "a structural tag (a dict or a JSON string)",
            self.structural_tag,
        )
        _check(
            self.json_object is None or isinstance(self.json_object, bool),
            f"{name}.json_object",
            "a bool",
            self.json_object,
        )
        _check(
            isinstance(self.jump_forward, bool),
            f"{name}.jump_forward",
            "a bool",
            self.jump_forward,
        )
        _check(
            isinstance(self.disable_any_whitespace, bool),
            f"{name}.disable_any_whitespace",
            "a bool",
            self.disable_any_whitespace,
        )
        _check(
            self.whitespace_pattern is None or isinstance(self.whitespace_pattern, str),
            f"{name}.whitespace_pattern",
            "None or a string",
            self.whitespace_pattern,
        )
        kinds = self.kinds()
        if len(kinds) != 1:
            got = ", ".join(kinds) if kinds else "none"
            raise InvalidRequestError(
                f"{name} must set exactly one of {', '.join(_KINDS)}; got {got}", param=name
            )
        if self.whitespace_pattern is not None:
            raise ValueError(
                f"{name}.whitespace_pattern is not supported by the xgrammar backend; "
                "use disable_any_whitespace=True for JSON without free whitespace"
            )

    def kinds(self) -> list[str]:
        """The constraint kinds set (``json``, ``regex``, ...): one once constructed."""
        kinds = [k for k in ("json", "regex", "choice", "grammar") if getattr(self, k) is not None]
        kinds += ["json_object"] if self.json_object else []
        return kinds + (["structural_tag"] if self.structural_tag is not None else [])

    @property
    def kind(self) -> str:
        """The one constraint kind set."""
        return self.kinds()[0]

    def as_dict(self) -> dict[str, Any]:
        """The set fields as plain data (``StructuredOutputsParams(**d)`` rebuilds it)."""
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self)}


@dataclass
class SamplingParams:
    """How to sample one request's outputs (vLLM / OpenAI semantics).

    Attributes:
        n: output sequences returned per prompt.
        best_of: sequences generated (>= n); the n with the highest cumulative
            logprob are returned. Default: n. All share the prompt's KV blocks.
        temperature: softmax temperature, >= 0; 0 means greedy.
        top_p: nucleus probability mass, in (0, 1].
        top_k: keep the k most likely tokens; 0 or -1 disables.
        min_p: drop tokens whose probability is below min_p x the top one, in [0, 1].
        presence_penalty: subtracted once from the logit of every token already
            generated, in [-2, 2].
        frequency_penalty: subtracted from a token's logit per time it was
            generated, in [-2, 2].
        repetition_penalty: divides positive / multiplies negative logits of
            tokens in the prompt or output (CTRL, Keskar et al. 2019), > 0.
        seed: per-request seed; the same seed gives the same outputs whatever
            else is in the batch.
        stop: strings that end generation when the text contains one; the
            stop string is cut from the text unless include_stop_str_in_output.
        stop_token_ids: token ids that end generation (besides EOS).
        include_stop_str_in_output: keep the matched stop string.
        ignore_eos: keep generating past EOS.
        max_tokens: most tokens to generate per sequence, >= 1.
        min_tokens: EOS and stop token ids are masked before this many tokens.
        logprobs: return the log-probabilities of the sampled token and of the
            ``logprobs`` most likely tokens at each step (raw model
            distribution); None for none.
        prompt_logprobs: the same for each prompt token (those requests skip
            the prefix cache, whose hits would skip the logits).
        skip_special_tokens: drop special tokens from the output text.
        structured_outputs: constrain the output (JSON schema, regex, choice,
            grammar, JSON object); a dict is converted. The sequence ends
            ("stop") when its grammar is complete, with ``ignore_eos`` too;
            not for beam search.

    Raises:
        ValueError: on construction, naming the invalid field.
    """

    n: int = 1
    best_of: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        _check_positive_int(self.n, "n")
        if self.best_of is None:
            self.best_of = self.n
        _check(
            _is_int(self.best_of) and self.best_of >= self.n,
            "best_of",
            f"an integer >= n ({self.n})",
            self.best_of,
        )
        _check(
            _finite(self.temperature) and self.temperature >= 0,
            "temperature",
            "a finite number >= 0",
            self.temperature,
        )
        _check(
            _finite(self.top_p) and 0 < self.top_p <= 1, "top_p", "a number in (0, 1]", self.top_p
        )
        _check(_is_int(self.top_k) and self.top_k >= -1, "top_k", "-1, 0 (off) or >= 1", self.top_k)
        _check(
            _finite(self.min_p) and 0 <= self.min_p <= 1, "min_p", "a number in [0, 1]", self.min_p
        )
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            _check(_finite(v) and -2 <= v <= 2, name, "a number in [-2, 2]", v)
        _check(
            _finite(self.repetition_penalty) and self.repetition_penalty > 0,
            "repetition_penalty",
            "a finite number > 0",
            self.repetition_penalty,
        )
        _check_positive_int(self.max_tokens, "max_tokens")
        _check(
            _is_int(self.min_tokens) and 0 <= self.min_tokens <= self.max_tokens,
            "min_tokens",
            f"in [0, max_tokens={self.max_tokens}]",
            self.min_tokens,
        )
        _check(
            self.seed is None or (_is_int(self.seed) and 0 <= self.seed < 2**63),
            "seed",
            "None or in [0, 2**63)",
            self.seed,
        )
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        _check(
            self.stop is None or isinstance(self.stop, (list, tuple)),
            "stop",
            "a string or a list of strings",
            self.stop,
        )
        self.stop = list(self.stop or [])
        _check(
            all(isinstance(s, str) and s for s in self.stop),
            "stop",
            "non-empty strings",
            self.stop,
        )
        self.stop_token_ids = list(self.stop_token_ids or [])
        _check(
            all(_is_int(t) and t >= 0 for t in self.stop_token_ids),
            "stop_token_ids",
            "non-negative integers",
            self.stop_token_ids,
        )
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            _check(v is None or (_is_int(v) and v >= 0), name, "None or an integer >= 0", v)
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            v = getattr(self, name)
            _check(isinstance(v, bool), name, "a bool", v)
        if isinstance(self.structured_outputs, dict):
            known = {f.name for f in fields(StructuredOutputsParams)}
            unknown = sorted(set(self.structured_outputs) - known)
            if unknown:
                raise ValueError(
                    f"structured_outputs has unknown fields {unknown}; known: {sorted(known)}"
                )
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        _check(
            self.structured_outputs is None
            or isinstance(self.structured_outputs, StructuredOutputsParams),
            "structured_outputs",
            "None, a StructuredOutputsParams or a dict of its fields",
            self.structured_outputs,
        )

    def clone(self) -> SamplingParams:
        """A deep copy (vLLM's ``clone``): changing it, or its lists, leaves
        this one as it was."""
        return copy.deepcopy(self)

    @property
    def greedy(self) -> bool:
        """True when decoding is greedy (temperature 0)."""
        return self.temperature == 0.0

    @property
    def needs_penalties(self) -> bool:
        """True when any repetition, presence or frequency penalty applies."""
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
        )


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass
class BeamSearchParams:
    """Beam search settings (vLLM's names; HF transformers' semantics).

    Attributes:
        beam_width: beams kept per request (k), >= 1.
        max_tokens: most generated tokens per beam, >= 1.
        ignore_eos: EOS does not finish a beam.
        length_penalty: a finished beam scores sum(logprobs) / length**length_penalty
            (length = generated tokens).
        early_stopping: True stops once beam_width beams finished; False stops
            when no running beam can beat the worst finished one at its current
            length; "never" assumes the longest length when length_penalty > 0.

    Raises:
        ValueError: naming the invalid field.
    """

    beam_width: int
    max_tokens: int = 16
    ignore_eos: bool = False
    length_penalty: float = 1.0
    early_stopping: bool | str = False

    def __post_init__(self) -> None:
        _check_positive_int(self.beam_width, "beam_width")
        _check_positive_int(self.max_tokens, "max_tokens")
        _check(
            _finite(self.length_penalty), "length_penalty", "a finite number", self.length_penalty
        )
        _check(
            self.early_stopping in (True, False, "never"),
            "early_stopping",
            "True, False or 'never'",
            self.early_stopping,
        )
