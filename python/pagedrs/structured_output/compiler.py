"""Compiled grammars over the engine's vocabulary, compiled once and kept in an LRU."""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

import xgrammar as xgr

from .spec import GrammarSpec, grammar_error


class GrammarCompilerCache:
    """xgrammar's ``GrammarCompiler`` over the engine's tokenizer, with an LRU of
    compiled grammars keyed by ``GrammarSpec``.

    The vocabulary (``TokenizerInfo``, ~0.2 s for a 49k-token vocabulary) is read
    on the first compile. Used by the engine's thread only.

    Args:
        tokenizer: the engine's HF tokenizer.
        vocab_size: width of the model's logits (may exceed the tokenizer's
            vocabulary: padding ids are never allowed).
        stop_token_ids: the ids that end a sequence once its grammar is complete
            (the engine's EOS ids); None lets xgrammar read them from the tokenizer.
        max_entries: compiled grammars kept (least recently used dropped first).
    """

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: list[int] | None,
        max_entries: int = 256,
    ) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = max(int(vocab_size), len(tokenizer))
        self._stop_token_ids = list(stop_token_ids) if stop_token_ids else None
        self.max_entries = max_entries
        self._compiler: xgr.GrammarCompiler | None = None
        self._info: xgr.TokenizerInfo | None = None
        self._cache: OrderedDict[GrammarSpec, xgr.CompiledGrammar] = OrderedDict()
        self.hits = 0
        self.misses = 0

    @property
    def tokenizer_info(self) -> xgr.TokenizerInfo:
        """xgrammar's view of the vocabulary (built on first use)."""
        if self._info is None:
            self._info = xgr.TokenizerInfo.from_huggingface(
                self._tokenizer, vocab_size=self.vocab_size, stop_token_ids=self._stop_token_ids
            )
        return self._info

    def _xgr_compiler(self) -> xgr.GrammarCompiler:
        if self._compiler is None:
            # The LRU here is the one cache: xgrammar's own is off.
            self._compiler = xgr.GrammarCompiler(
                self.tokenizer_info, max_threads=min(8, os.cpu_count() or 1), cache_enabled=False
            )
        return self._compiler

    def compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        """The compiled grammar of ``spec`` (cached).

        Raises:
            ValueError: the spec is not a valid schema, regex or grammar.
        """
        hit = self._cache.get(spec)
        if hit is not None:
            self._cache.move_to_end(spec)
            self.hits += 1
            return hit
        grammar = spec.build()
        try:
            compiled = self._xgr_compiler().compile_grammar(grammar)
        except Exception as exc:  # xgrammar raises RuntimeError and its own types
            raise ValueError(f"cannot compile the {spec.kind}: {grammar_error(exc)}") from None
        self.misses += 1
        self._cache[spec] = compiled
        if len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)
        return compiled

    def __len__(self) -> int:
        return len(self._cache)
