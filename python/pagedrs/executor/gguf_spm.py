"""A Gemma GGUF's SentencePiece tokenizer written straight from its metadata.

A Gemma 2 or Gemma 3 GGUF (``general.architecture`` ``gemma2`` or ``gemma3``,
``tokenizer.ggml.model`` ``llama``) holds a SentencePiece BPE vocabulary with
byte fallback (the ``<0x00>``..``<0xFF>`` tokens) and no merges.
transformers (``integrations/gguf/gguf_tokenizer_mapping.gemma_tokenizer``)
builds a ``GemmaTokenizer`` from it: the vocabulary with each token of two or
more characters that are all whitespace, one a space, respelled as that many
``▁``; merges derived in Python from the vocabulary, each token's rank its
position in the file (``generate_merges``: seconds for Gemma 3's 262,144
tokens); then the control tokens added as special tokens and the
user-defined ones as plain added tokens. ``spm_tokenizer_files`` writes the
``tokenizer.json`` and ``tokenizer_config.json`` that ``save_pretrained``
writes for it, the merges derived in Rust (``_core.spm_merges_json``, the
same order); ``tokenizers`` then reads them. What it writes, as transformers
builds it:

- the model: ``BPE`` with byte fallback, ``fuse_unk``, unknown token
  ``<unk>``, over the respelled vocabulary and the derived merges;
- normalizer ``Replace(" ", "▁")``, pre-tokenizer ``Split(" ",
  merged_with_previous)``, decoder ``Replace("▁", " ")``, ``ByteFallback``,
  ``Fuse`` (``GemmaTokenizer``'s own);
- added tokens, each matched whole and never normalized at its vocabulary
  id: ``GemmaTokenizer``'s default special tokens (``<pad>``, ``<eos>``,
  ``<bos>``, ``<unk>``, ``<mask>``) and the file's BOS / EOS / unknown /
  padding tokens and control tokens, as special; the user-defined tokens,
  plain;
- post-processor: BOS before each sequence unless ``add_bos_token`` is false
  (transformers' default for a SentencePiece GGUF is true), EOS after it when
  ``add_eos_token`` is;
- ``tokenizer_config.json``: the BOS / EOS / unknown / padding tokens' texts
  (``GemmaTokenizer``'s defaults where the file names none), ``<mask>``, the
  class and ``model_max_length`` as transformers saves them.

Files this does not build exactly are left to transformers
(``spm_tokenizer_files`` returns None): another architecture or tokenizer
model, a file with merges, a name given twice (after the respelling), a
special token outside the vocabulary, a user-defined token that is also a
special one, or a string Rust cannot take (a lone surrogate). The tests hold
both files to transformers' own for Gemma 3 and for test-written files.
"""

from __future__ import annotations

import json
from typing import Any

from .gguf_bpe import CONTROL, USER_DEFINED, special_texts
from .gguf_tokens import TOKENIZER_ARRAYS

#: The architectures whose SentencePiece vocabulary transformers builds as
#: ``gemma_tokenizer`` does (transformers reads no Gemma 1 GGUF).
ARCHITECTURES = ("gemma2", "gemma3")

#: The metadata arrays ``spm_tokenizer_files`` reads (``gguf_header.read_header``).
ARRAYS = TOKENIZER_ARRAYS

#: ``GemmaTokenizer``'s special tokens: ``(config key, default text, GGUF id
#: key or None)``, in the order transformers adds them.
GEMMA_SPECIALS: tuple[tuple[str, str | None, str | None], ...] = (
    ("bos_token", "<bos>", "bos_token_id"),
    ("eos_token", "<eos>", "eos_token_id"),
    ("unk_token", "<unk>", "unknown_token_id"),
    ("pad_token", "<pad>", "padding_token_id"),
    ("mask_token", "<mask>", None),
)

#: ``BPE`` of ``GemmaTokenizer``, without its vocabulary and merges.
_MODEL = {
    "type": "BPE",
    "dropout": None,
    "unk_token": "<unk>",
    "continuing_subword_prefix": None,
    "end_of_word_suffix": None,
    "fuse_unk": True,
    "byte_fallback": True,
    "ignore_merges": False,
}


def respell(token: str) -> str:
    """``token`` as ``GemmaTokenizer`` looks it up: two or more whitespace
    characters, one a space, as that many ``▁``; any other unchanged."""
    return "\u2581" * len(token) if " " in token and not token.strip() else token


def _pipeline(specials: dict[str, str], vocab: dict[str, int], meta: dict[str, Any]) -> str:
    """tokenizer.json's normalizer, pre-tokenizer, post-processor and
    decoder, as ``tokenizers`` serializes them (JSON members, no braces)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    bos, eos = specials["bos_token"], specials["eos_token"]
    # transformers adds BOS / EOS only where the file names their ids
    has_bos, has_eos = (
        "tokenizer.ggml.bos_token_id" in meta,
        "tokenizer.ggml.eos_token_id" in meta,
    )
    add_bos = has_bos and meta.get("tokenizer.ggml.add_bos_token", True) is True
    add_eos = has_eos and meta.get("tokenizer.ggml.add_eos_token") is True

    def template(seq: str, type_id: int) -> str:
        first = [f"{bos}:{type_id}"] if add_bos else []
        last = [f"{eos}:{type_id}"] if add_eos else []
        return " ".join([*first, f"${seq}:{type_id}", *last])

    single = template("A", 0)
    used = [(t, vocab[t]) for t, on in ((bos, add_bos), (eos, add_eos)) if on]
    tok.post_processor = processors.TemplateProcessing(
        single=single, pair=f"{single} {template('B', 1)}", special_tokens=used
    )
    data = json.loads(tok.to_str())
    keys = ("normalizer", "pre_tokenizer", "post_processor", "decoder")
    return ",".join(f"{json.dumps(k)}:{json.dumps(data[k], ensure_ascii=False)}" for k in keys)


def spm_tokenizer_files(meta: dict[str, Any], class_name: str) -> dict[str, str] | None:
    """``tokenizer.json`` and ``tokenizer_config.json`` (file name -> text)
    of the Gemma SentencePiece vocabulary in GGUF metadata ``meta`` (read
    with ``ARRAYS`` kept), as transformers saves its tokenizer of class
    ``class_name``; None for a file this module leaves to transformers
    (module docs)."""
    from .. import _core

    if (
        meta.get("tokenizer.ggml.model") != "llama"
        or meta.get("general.architecture") not in ARCHITECTURES
        or class_name != "GemmaTokenizer"
        or "tokenizer.ggml.merges" in meta
    ):
        return None
    tokens = meta.get(ARRAYS[0])
    if not isinstance(tokens, list) or not tokens:
        return None
    types = meta.get(ARRAYS[2])
    types = [] if types is None or isinstance(types, int) else types.tolist()
    if types and len(types) != len(tokens):
        return None
    found = special_texts(meta, tokens, GEMMA_SPECIALS)
    if found is None:
        return None
    specials = {k: v for k, v in found.items() if v is not None}  # each has a default
    spelled = [respell(t) for t in tokens]
    vocab = {t: i for i, t in enumerate(spelled)}
    if len(vocab) != len(spelled):  # a name given twice: ids left to transformers
        return None
    special = {t for t in specials.values()}
    special.update(t for t, k in zip(tokens, types, strict=False) if k == CONTROL)
    user = {t for t, k in zip(tokens, types, strict=False) if k == USER_DEFINED and t in vocab}
    if not special <= vocab.keys() or special & user:
        return None
    try:
        merges = _core.spm_merges_json(spelled)
    except (TypeError, ValueError, UnicodeError):  # a string Rust cannot take
        return None
    quote = json.encoder.encode_basestring
    flags = '"single_word":false,"lstrip":false,"rstrip":false,"normalized":false'
    added = sorted([(vocab[t], t, True) for t in special] + [(vocab[t], t, False) for t in user])
    added_text = ",".join(
        f'{{"id":{i},"content":{quote(c)},{flags},"special":{"true" if s else "false"}}}'
        for i, c, s in added
    )
    vocab_text = ",".join([f"{quote(t)}:{i}" for t, i in vocab.items()])
    model = json.dumps(_MODEL)[:-1]
    text = (
        f'{{"version":"1.0","truncation":null,"padding":null,"added_tokens":[{added_text}],'
        f"{_pipeline(specials, vocab, meta)},"
        f'"model":{model},"vocab":{{{vocab_text}}},"merges":{merges}}}}}'
    )
    from transformers.tokenization_utils_base import VERY_LARGE_INTEGER

    # transformers names a special token in the config only where the file has its id
    named = {
        name: specials[name] if key is None or f"tokenizer.ggml.{key}" in meta else None
        for name, _, key in GEMMA_SPECIALS
    }
    config = {
        "backend": "tokenizers",
        **named,
        "model_max_length": VERY_LARGE_INTEGER,
        "tokenizer_class": class_name,
    }
    return {
        "tokenizer.json": text,
        "tokenizer_config.json": json.dumps(config, indent=2, sort_keys=True),
    }
