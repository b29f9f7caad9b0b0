"""A GGUF file's special tokens and chat template, as llama.cpp reads them.

llama.cpp (``llama_vocab::load``) takes BOS / EOS / EOT / EOM and the
fill-in-the-middle tokens from the ``tokenizer.ggml.*_token_id`` keys, and
``add_bos_token`` from ``tokenizer.ggml.add_bos_token``. Where the EOT, EOM or
FIM pad / repo / separator key is missing it recognises the token by its text
(``EOT_TEXTS``, ...: the first such token). Generation ends at any
*end-of-generation* token: the FIM pad / repo / separator tokens, every token
whose text is in ``EOG_TEXTS``, and the EOS, EOT and EOM tokens; except that
``<|end|>`` is not one when ``<|return|>`` and ``<|call|>`` (or ``<|calls|>``
and ``<|flush|>``) are, nor ``</s>`` when ``<|tool_response>`` is.
``special_tokens`` computes the same set from the file's metadata and token
texts (the tests compare it to llama.cpp's ``llama_vocab_is_eog`` over the
whole vocabulary); the engine stops a sequence at each of them, as llama.cpp
does, unless ``ignore_eos``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .quant.gguf_header import read_header

TOKENS = "tokenizer.ggml.tokens"
CHAT_TEMPLATE = "tokenizer.chat_template"

#: The arrays read with the vocabulary: the same set as the tokenizer's
#: (``gguf_bpe.ARRAYS``) and as a header's first parse keeps
#: (``gguf_parses.VOCABULARY_ARRAYS``), so that one parse serves all.
TOKENIZER_ARRAYS = (TOKENS, "tokenizer.ggml.merges", "tokenizer.ggml.token_type")

#: Texts llama.cpp takes as the end-of-turn token when ``eot_token_id`` is absent.
EOT_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|end_of_text|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "<end_of_utterance>",
    }
)
EOM_TEXTS = frozenset({"<|eom_id|>"})
FIM_PAD_TEXTS = frozenset({"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"})
FIM_REP_TEXTS = frozenset({"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"})
FIM_SEP_TEXTS = frozenset({"<|file_sep|>"})

#: Texts of tokens that end generation whatever the keys say.
EOG_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<|flush|>",
        "<|calls|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "</s>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "[EOS]",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<eos>",
        "<turn|>",
        "<|tool_response>",
    }
)


@dataclass(frozen=True)
class GGUFSpecialTokens:
    """Special tokens of a GGUF file (module docs).

    Attributes:
        bos, eos, eot, eom: token ids, or None when the file has none.
        add_bos: whether a prompt starts with BOS (``add_bos_token``; None
            when the key is absent).
        eog: every end-of-generation token id, ascending.
        chat_template: ``tokenizer.chat_template``, or None.
    """

    bos: int | None
    eos: int | None
    eot: int | None
    eom: int | None
    add_bos: bool | None
    eog: tuple[int, ...]
    chat_template: str | None


def _key_id(meta: dict[str, Any], name: str, n_vocab: int) -> int | None:
    value = meta.get(f"tokenizer.ggml.{name}_token_id")
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < n_vocab:
        return value
    return None


def _by_text(tokens: list[str], texts: frozenset[str]) -> int | None:
    return next((i for i, t in enumerate(tokens) if t in texts), None)


def special_tokens(path: Path) -> GGUFSpecialTokens:
    """The special tokens of GGUF ``path`` (module docs), kept in pagedrs'
    cache of the file's header (``gguf_cache``).

    Raises:
        ValueError: a file ``gguf_header.read_header`` refuses.
    """
    from .gguf_cache import cached_json

    value = cached_json(path, "special_tokens", lambda: asdict(read_special_tokens(path)))
    return GGUFSpecialTokens(**{**value, "eog": tuple(value["eog"])})


def read_special_tokens(path: Path) -> GGUFSpecialTokens:
    """``special_tokens`` read from the file itself (its vocabulary parsed).

    Raises:
        ValueError: a file ``gguf_header.read_header`` refuses.
    """
    header = read_header(path, arrays=TOKENIZER_ARRAYS)
    header.buffer.close()
    meta = header.metadata
    tokens = meta.get(TOKENS)
    tokens = tokens if isinstance(tokens, list) else []
    n = len(tokens)
    bos, eos = _key_id(meta, "bos", n), _key_id(meta, "eos", n)
    eot = _key_id(meta, "eot", n)
    eot = eot if eot is not None else _by_text(tokens, EOT_TEXTS)
    eom = _key_id(meta, "eom", n)
    eom = eom if eom is not None else _by_text(tokens, EOM_TEXTS)
    eog = {i for i, t in enumerate(tokens) if t in EOG_TEXTS}
    for name, texts in (
        ("fim_pad", FIM_PAD_TEXTS),
        ("fim_rep", FIM_REP_TEXTS),
        ("fim_sep", FIM_SEP_TEXTS),
    ):
        fim = _key_id(meta, name, n)
        fim = fim if fim is not None else _by_text(tokens, texts)
        if fim is not None:
            eog.add(fim)
    eog |= {i for i in (eos, eot, eom) if i is not None}
    eog_texts = {tokens[i] for i in eog}
    if "<|end|>" in eog_texts and (
        {"<|return|>", "<|call|>"} <= eog_texts or {"<|calls|>", "<|flush|>"} <= eog_texts
    ):
        eog -= {i for i in eog if tokens[i] == "<|end|>"}
    if "<|tool_response>" in eog_texts:
        eog -= {i for i in eog if tokens[i] == "</s>"}
    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    template = meta.get(CHAT_TEMPLATE)
    return GGUFSpecialTokens(
        bos,
        eos,
        eot,
        eom,
        add_bos if isinstance(add_bos, bool) else None,
        tuple(sorted(eog)),
        template if isinstance(template, str) else None,
    )
