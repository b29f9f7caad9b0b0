"""A request's grammar as a cache key, and its conversion to an xgrammar ``Grammar``.

The conversion needs no tokenizer, so the HTTP front end validates requests with it
(a 400 before anything is queued) and the engine compiles the same spec later.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

import xgrammar as xgr

from ..sampling_params import StructuredOutputsParams

# xgrammar's messages start with "[hh:mm:ss] /path/file.cc:line: ".
_LOCATION = re.compile(r"^\s*\[[\d:]+\]\s+\S+:\d+:\s*")


def grammar_error(exc: BaseException) -> str:
    """xgrammar's error message without its time stamp and C++ source location."""
    lines = [_LOCATION.sub("", line) for line in str(exc).strip().splitlines()]
    return " ".join(line.strip() for line in lines if line.strip()) or type(exc).__name__


@dataclass(frozen=True)
class GrammarSpec:
    """One constraint in a canonical form: equal specs compile to the same grammar.

    Attributes:
        kind: "json" (a JSON schema, ``json_object`` included), "regex",
            "grammar" (EBNF; ``choice`` becomes an alternation of literals) or
            "structural_tag" (xgrammar's).
        text: the schema as compact JSON text (keys in the given order, which
            is the order properties are generated in), the regex, the EBNF, or
            the structural tag as compact JSON text.
        any_whitespace: JSON may hold free whitespace between tokens (False:
            fixed ``", "`` and ``": "`` separators); ignored for other kinds.
        reasoning_end: the constrained answer follows free text ending at the
            first occurrence of this text (``StructuredOutputsParams.reasoning_end``).
        reasoning_optional: the free text and its end may be absent.
    """

    kind: str
    text: str
    any_whitespace: bool = True
    reasoning_end: str | None = None
    reasoning_optional: bool = False

    @classmethod
    def from_params(cls, params: StructuredOutputsParams) -> GrammarSpec:
        """The spec of validated ``params`` (one kind set)."""
        answer = cls._answer(params)
        if params.reasoning_end is None:
            return answer
        return replace(
            answer,
            reasoning_end=params.reasoning_end,
            reasoning_optional=params.reasoning_optional,
        )

    @classmethod
    def _answer(cls, params: StructuredOutputsParams) -> GrammarSpec:
        any_ws = not params.disable_any_whitespace
        if params.json is not None:
            schema = json.loads(params.json) if isinstance(params.json, str) else params.json
            return cls("json", json.dumps(schema, separators=(",", ":")), any_ws)
        if params.json_object:
            return cls("json", '{"type":"object"}', any_ws)
        if params.regex is not None:
            return cls("regex", params.regex)
        if params.structural_tag is not None:
            tag = params.structural_tag
            if isinstance(tag, str):
                try:
                    tag = json.loads(tag)
                except ValueError as exc:
                    raise ValueError(f"invalid structural tag: not JSON: {exc}") from None
            return cls("structural_tag", json.dumps(tag, separators=(",", ":")))
        if params.choice is not None:
            # JSON string escapes are EBNF literal escapes.
            alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in params.choice)
            return cls("grammar", f"root ::= {alternatives}")
        assert params.grammar is not None
        return cls("grammar", params.grammar)

    def build(self) -> xgr.Grammar:
        """The xgrammar grammar (no tokenizer involved; milliseconds for usual specs).

        With ``reasoning_end``: the answer's grammar after xgrammar's ``any_text``
        up to the end text (a structural tag whose content excludes its end), so
        the reasoning is any text without the end, in any tokenization, and the
        answer starts at the character after it; with ``reasoning_optional``
        the union of that and the answer alone.

        Raises:
            ValueError: the schema, regex or grammar is invalid or unsupported,
                with xgrammar's explanation.
        """
        answer = self._build_answer()
        if self.reasoning_end is None:
            return answer
        reasoning = xgr.Grammar.from_structural_tag(
            {
                "type": "structural_tag",
                "format": {
                    "type": "tag",
                    "begin": "",
                    "content": {"type": "any_text"},
                    "end": self.reasoning_end,
                },
            }
        )
        after = xgr.Grammar.concat(reasoning, answer)
        return xgr.Grammar.union(after, answer) if self.reasoning_optional else after

    def _build_answer(self) -> xgr.Grammar:
        try:
            if self.kind == "json":
                return xgr.Grammar.from_json_schema(
                    self.text, any_whitespace=self.any_whitespace, strict_mode=True
                )
            if self.kind == "regex":
                return xgr.Grammar.from_regex(self.text)
            if self.kind == "structural_tag":
                return xgr.Grammar.from_structural_tag(self.text)
            return xgr.Grammar.from_ebnf(self.text)
        except Exception as exc:  # xgrammar raises RuntimeError and its own types
            what = {
                "json": "JSON schema",
                "regex": "regex",
                "grammar": "grammar",
                "structural_tag": "structural tag",
            }[self.kind]
            raise ValueError(f"invalid {what}: {grammar_error(exc)}") from None


def json_schema_ebnf(schema: dict[str, Any]) -> str:
    """EBNF of JSON valid against ``schema`` written as Python's ``json.dumps``
    and Hugging Face's ``tojson`` write it (separators ``", "`` and ``": "``,
    no other whitespace, properties in the schema's order): the form a chat
    template renders again, for a structural tag's content.

    Raises:
        ValueError: an invalid or unsupported schema, with xgrammar's explanation.
    """
    try:
        grammar = xgr.Grammar.from_json_schema(
            json.dumps(schema), any_whitespace=False, strict_mode=True
        )
    except Exception as exc:  # xgrammar raises RuntimeError and its own types
        raise ValueError(f"invalid JSON schema: {grammar_error(exc)}") from None
    return str(grammar)


def validate(params: StructuredOutputsParams) -> GrammarSpec:
    """Check that ``params`` converts to a grammar; returns its spec.

    Raises:
        ValueError: as ``GrammarSpec.build``.
    """
    spec = GrammarSpec.from_params(params)
    spec.build()
    return spec
