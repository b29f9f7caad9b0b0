"""The pre-tokenizer of a GGUF byte-level BPE, as llama.cpp reads it.

A GGUF whose ``tokenizer.ggml.model`` is ``gpt2`` names its pre-tokenizer in
``tokenizer.ggml.pre``: how text is cut into chunks before the merges run on
each chunk. llama.cpp, the format's reference, maps each name to a sequence
of regular expressions (``llama-vocab.cpp``, ``llm_tokenizer_bpe``): the
first cuts the text into its matches and the text between them, each later
one cuts every piece again the same way. Some names also make the BPE take a
chunk that is itself a vocabulary entry whole, without merging
(``ignore_merges``, as Llama 3's ``tokenizer.json`` sets it).

transformers' GGUF converter knows a subset of the names and cuts the rest
with GPT-2's expression, which parts from llama.cpp's ids wherever the file
names, say, ``smollm`` or ``starcoder`` (digits cut one by one first) or
``default`` (punctuation runs and digit triples cut first), and never
ignores merges. ``PRE_TOKENIZERS`` holds llama.cpp's cuts for the names
whose expressions ``tokenizers`` (Oniguruma) matches exactly; each is held
to llama.cpp's ids on the same file in ``tests/models/test_gguf_pretok.py``.
A file naming another pre-tokenizer is refused (``pre_tokenizer``), never
cut another way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: English contractions, each letter in either case (llama.cpp's spelling of
#: ``(?i:'s|'t|...)``, which Unicode case folding would widen to ``ſ``).
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#: GPT-2's chunks: contractions, letters, digits, other runs, each with one
#: leading space; whitespace not before a non-space.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
#: The tail of cl100k-style chunks: other runs with the line breaks after
#: them, line breaks with the spaces before them, whitespace.
_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def _llama3(digits: str) -> str:
    """Llama 3's (cl100k's) chunks, digits in runs matching ``digits``."""
    return _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|" + digits + _TAIL


#: A letter that is not ``a``-``z`` (upper) or not ``A``-``Z`` (lower).
_UPPER, _LOWER = r"((?=[\p{L}])([^a-z]))", r"((?=[\p{L}])([^A-Z]))"


def _cased(tail: str, digits: str) -> str:
    """Tekken's and GPT-4o's chunks: words cut at case changes, each
    followed by ``tail``; digits in runs matching ``digits``."""
    word = r"[^\r\n\p{L}\p{N}]?"
    return (
        f"{word}{_UPPER}*{_LOWER}+{tail}|{word}{_UPPER}+{_LOWER}*{tail}|{digits}"
        + r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    )


_QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SEED_CODER = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}"
    r"| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"


@dataclass(frozen=True)
class PreTokenizer:
    """How a byte-level BPE cuts text before merging.

    Attributes:
        splits: regular expressions applied in turn; each cuts every piece
            into its matches and the text between them.
        ignore_merges: a chunk that is a vocabulary entry is that token,
            unmerged.
    """

    splits: tuple[str, ...]
    ignore_merges: bool = False


def _family(pre: PreTokenizer, *names: str) -> dict[str, PreTokenizer]:
    return dict.fromkeys(names, pre)


#: llama.cpp's pre-tokenizer of each ``tokenizer.ggml.pre`` name that
#: pagedrs cuts exactly (module docs). ``default`` is also a file's without
#: the key.
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    **_family(
        PreTokenizer((_GPT2,)),
        *("gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4"),
        *("jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "gigachat", "a.x-4.0"),
        *("mellum", "modern-bert"),
    ),
    **_family(
        PreTokenizer((r"\p{N}", _GPT2)),
        *("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"),
        "mellum2",
    ),
    **_family(
        PreTokenizer((_llama3(r"\p{N}{1,3}"),), ignore_merges=True),
        *("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0"),
        *("lfm2", "jina-v5-nano", "glm4", "glm5"),
    ),
    **_family(PreTokenizer((_llama3(r"\p{N}{1,3}"),)), "dbrx", "smaug-bpe", "chatglm-bpe"),
    **_family(
        PreTokenizer((_llama3(r"\p{N}"),)),
        *("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan"),
        "solar-open",
    ),
    "qwen35": PreTokenizer((_QWEN35,)),
    "seed-coder": PreTokenizer((_SEED_CODER,)),
    "tekken": PreTokenizer((_cased("", r"\p{N}"),), ignore_merges=True),
    **_family(
        PreTokenizer((_cased(_CONTRACTIONS + "?", r"\p{N}{1,3}"),)),
        *("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"),
    ),
    **_family(PreTokenizer((_BLOOM,)), "bloom", "poro-chat", "gpt3-finnish"),
    "viking": PreTokenizer((_BLOOM, r"\p{N}")),
    "falcon": PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]")),
    "default": PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]")),
}


def pre_tokenizer(meta: dict[str, Any]) -> PreTokenizer:
    """The pre-tokenizer of the byte-level BPE in GGUF metadata ``meta``
    (``tokenizer.ggml.pre``; ``default`` where the key is missing, as
    llama.cpp reads it).

    Raises:
        ValueError: a name ``PRE_TOKENIZERS`` does not hold, or a value that
            is not a string, naming the key and its value.
    """
    name = meta.get("tokenizer.ggml.pre", "default")
    if name == "":
        name = "default"
    if not isinstance(name, str):
        raise ValueError(f"tokenizer.ggml.pre {name!r}: not a string (a pre-tokenizer's name)")
    pre = PRE_TOKENIZERS.get(name)
    if pre is None:
        raise ValueError(
            f"tokenizer.ggml.pre {name!r}: a pre-tokenizer pagedrs does not cut text with "
            f"({len(PRE_TOKENIZERS)} names are known: llama-bpe, qwen2, smollm, tekken, "
            "gpt-2, default, ...; executor/gguf_pretok.py lists them); give this file a "
            "tokenizer: LLM(model=..., tokenizer=HF_FOLDER), or --tokenizer HF_FOLDER"
        )
    return pre


def set_pre_tokenizer(tokenizer: Any, pre: PreTokenizer) -> None:
    """Make ``tokenizers.Tokenizer`` ``tokenizer`` (a byte-level BPE) cut
    text with ``pre``: its pre-tokenizer becomes ``pre.splits``, each an
    isolating split, then the byte-level spelling without GPT-2's own split;
    its model's ``ignore_merges`` becomes ``pre.ignore_merges``."""
    from tokenizers import Regex, pre_tokenizers

    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(s), behavior="isolated") for s in pre.splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tokenizer.model.ignore_merges = pre.ignore_merges
