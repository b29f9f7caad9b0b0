"""Structured outputs: constrain sampling to a JSON schema, a regex, a choice or an
EBNF grammar with token bitmasks.

The grammar library is xgrammar (Dong et al., 2024): it is the default backend of
vLLM and SGLang, so outputs and supported schemas match what their users get; it
works on token bitmasks (int32 ``[rows, ceil(vocab/32)]``) that a whole batch fills
in one call without the GIL and applies to the logits in one kernel; its compiled
grammars are reusable objects that this package caches; and it covers JSON schema,
regex, EBNF and structural tags with one matcher type.

The engine (``LLMEngine``) compiles a request's grammar when it is added (cached by
spec, ``GrammarCompilerCache``), gives every sequence its own ``GrammarMatcher``
(``StructuredOutputManager``), fills the step's bitmask on a worker thread while the
forward runs, masks the logits before sampling (``apply_bitmask``), and advances each
matcher with its sampled token; a sequence whose grammar is complete ends ("stop").
"""

from .bitmask import StepBitmask, apply_bitmask
from .compiler import GrammarCompilerCache
from .manager import GrammarRejectedError, StructuredOutputManager
from .spec import GrammarSpec, grammar_error, json_schema_ebnf, validate

__all__ = [
    "GrammarCompilerCache",
    "GrammarRejectedError",
    "GrammarSpec",
    "StepBitmask",
    "StructuredOutputManager",
    "apply_bitmask",
    "grammar_error",
    "json_schema_ebnf",
    "validate",
]
