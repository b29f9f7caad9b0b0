"""Jump-forward decoding: where a grammar leaves exactly one possible text,
that text joins the sequence at once, written as the tokenizer's own tokens.

After a sequence's sampled token, its matcher may force a string (xgrammar's
``find_jump_forward_string``: the longest text every continuation starts
with). Decoding it token by token lets the model spell it in any tokens the
grammar allows (``lookup`` as ``l``, ``oo``, ``k``, ``up``), and a chat
template that renders the text back gives other tokens, so the next turn
misses the prefix cache from there on. Here the sampled token and the forced
text are tokenized together, as the tokenizer tokenizes the whole text, and
those tokens replace the sampled one (it is not computed yet: the next step
computes them all).

Token boundaries: the tokens must be the ones the tokenizer gives the whole
output, whatever follows. So the text is tokenized after a few tokens of
context, the run starts where the sampled token starts only if the tokenizer
has a boundary there, and it ends before the last pre-token (the text after
it may extend that piece: ``"`` before a string's ``\\``), unless the grammar
must stop there (only stop tokens, which are special, follow). Each run is
checked against the tokenizer's encoding of the whole text followed by
probe continuations; any doubt keeps the sampled token as it is. Tokenizers
without a pre-tokenizer that splits text, with a normalizer, or text holding
an added token, get no jumps.
"""

from __future__ import annotations

import functools
from typing import Any

# Continuations the run's tokens must not depend on: a letter, a digit,
# spaces, a newline, JSON's punctuation, a backslash, a non-ASCII letter.
PROBES: tuple[str, ...]
PROBES = ("", "a", " a", "A", "0", " ", "  ", "\n", '"', "'", "}", "]", ",", ":", "\\", "_", ".")
PROBES += ("\u00e9",)
CONTEXT_TOKENS = 4  # tokens before the sampled one that the check tokenizes with it


class CanonicalTokens:
    """The tokenizer's own tokens of a sampled token's text and the text a
    grammar forces after it.

    Args:
        tokenizer: the engine's HF tokenizer (a fast one: its ``backend_tokenizer``).
    """

    def __init__(self, tokenizer: Any) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        pre = None if backend is None or backend.normalizer is not None else backend.pre_tokenizer
        self._backend = backend
        self._pre = pre
        self._tokenizer = tokenizer
        self.enabled = pre is not None and len(pre.pre_tokenize_str("a b.c")) > 1

    @functools.cached_property
    def _added(self) -> list[str]:
        """The added tokens' texts (read on the first jump: a vocabulary may
        hold ~10^5 of them)."""
        if self._pre is None:
            return []
        return [t for t in self._tokenizer.get_added_vocab() if t]

    def _encode(self, text: str) -> list[int]:
        assert self._backend is not None
        return list(self._backend.encode(text, add_special_tokens=False).ids)

    def _decode(self, ids: list[int]) -> str:
        assert self._backend is not None
        return str(self._backend.decode(ids, skip_special_tokens=False))

    def tokens(self, context: list[int], token: int, forced: str, ends: bool) -> list[int] | None:
        """The tokens to put in place of ``token``: the tokenizer's tokens of
        its text and of as much of ``forced`` as they can cover for sure.

        Args:
            context: the tokens before ``token`` (the last ``CONTEXT_TOKENS``
                are used).
            token: the sampled token, not computed yet.
            forced: the text the grammar forces after it.
            ends: only stop tokens can follow ``forced``.
        Returns:
            the tokens (their text starts with ``token``'s and is longer), or
            None: no run is certain, ``token`` stays.
        """
        if not self.enabled or not forced:
            return None
        assert self._pre is not None
        ctx = list(context[-CONTEXT_TOKENS:])
        before = self._decode(ctx)
        with_token = self._decode([*ctx, token])
        if not with_token.startswith(before) or "\ufffd" in with_token + forced:
            return None  # a token inside a UTF-8 character
        start = len(before)
        full = with_token + forced
        if any(a in full[start:] for a in self._added):
            return None  # added tokens split the text before the pre-tokenizer
        if ends:
            end = len(full)
        else:
            pieces = self._pre.pre_tokenize_str(full)
            end = pieces[-1][1][0] if pieces else 0
        if end <= len(with_token):
            return None  # nothing of the forced text is certain
        run = self._encode(full[start:end])
        head = self._encode(before)
        expected = head + run
        if self._encode(full[:end]) != expected or self._decode(run) != full[start:end]:
            return None  # no token boundary where the sampled token starts
        for probe in ("",) if ends else PROBES:
            if self._encode(full + probe)[: len(expected)] != expected:
                return None  # what follows could change the run's tokens
        if run == [token]:
            return None
        return run
