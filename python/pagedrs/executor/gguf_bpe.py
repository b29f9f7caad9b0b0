"""A GGUF file's byte-level BPE tokenizer written straight from its metadata.

A GGUF whose ``tokenizer.ggml.model`` is ``gpt2`` (Llama 3, Qwen, SmolLM,
Mistral Nemo, ...) holds a byte-level BPE: ``tokenizer.ggml.tokens`` (the
vocabulary by id, spelled in GPT-2's byte alphabet), ``tokenizer.ggml.merges``
(``"left right"`` pairs, best first), ``token_type`` (llama.cpp's token
attributes: 3 control, 4 user-defined), ``pre`` (which pre-tokenizer split the
merges were learned on), the special-token ids and ``add_bos_token`` /
``add_eos_token``.

transformers builds its tokenizer from these in Python
(``integrations/gguf/gguf_tokenizer_mapping.py``: seconds for a
128k-token vocabulary, most of it parsing and adding tokens one by one), and
``save_pretrained`` writes it as ``tokenizer.json`` (``tokenizers``'
serialization) and ``tokenizer_config.json``. ``bpe_tokenizer_files`` writes
the same two files from the metadata directly; ``tokenizers`` then reads them
in Rust. What it writes, as transformers builds it:

- the model: ``BPE`` (no dropout, no unknown token, no subword prefix or
  suffix) over the vocabulary, each token whose characters are not all in the
  byte alphabet respelled as the alphabet's characters of its UTF-8 bytes (a
  later id wins a name given twice), and the file's merges;
- added tokens: the control tokens spelled in the alphabet, as special, then
  the user-defined tokens in the vocabulary, as plain added tokens, then any
  of the BOS / EOS / unknown / padding tokens not among them, as special; each
  matched whole in the text (never normalized) at its vocabulary id;
- pre-tokenizer: llama.cpp's cuts for the file's ``pre``
  (``gguf_pretok``; a name it does not hold is refused), then ``ByteLevel``
  without a split; the BPE ignores merges where llama.cpp does; decoder
  ``ByteLevel``. Here transformers' converter differs: it cuts with GPT-2's
  expression every ``pre`` it does not know and never ignores merges, so for
  those files the ids are llama.cpp's, not transformers';
- post-processor: BOS before each sequence when ``add_bos_token`` is set (and
  the file names a BOS), EOS after it when ``add_eos_token`` is;
- ``tokenizer_config.json``: the BOS / EOS / unknown / padding tokens' texts
  (null where the file has no id), the tokenizer class and
  ``model_max_length`` as transformers saves them.

Files this does not build exactly are left to transformers
(``bpe_tokenizer_files`` returns None): another tokenizer model, a file
without merges (transformers derives them from scores), a merge that is not
two names, a special-token id outside the vocabulary, a tokenizer class
other than ``SUPPORTED_CLASSES``, or added tokens whose ids or flags
transformers would choose otherwise (a name given twice, a special token
missing from the vocabulary, a user-defined token also control or
``<|endoftext|>``). The tests hold both files to transformers' own (its
pre-tokenizer and ``ignore_merges`` set to llama.cpp's) for SmolLM2 and for
test-written files of every token type and flag.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from .gguf_pretok import pre_tokenizer, set_pre_tokenizer
from .gguf_tokens import TOKENIZER_ARRAYS

#: llama.cpp's token types (``tokenizer.ggml.token_type``).
CONTROL, USER_DEFINED = 3, 4

#: Tokenizer classes whose saved ``tokenizer_config.json`` this module writes,
#: with the keys their ``save_pretrained`` adds.
SUPPORTED_CLASSES: dict[str, dict[str, Any]] = {
    "TokenizersBackend": {},
    "Qwen2Tokenizer": {"add_prefix_space": None},
}

#: The default BOS / EOS / unknown token of transformers' ``GPT2Tokenizer``,
#: which transformers builds a GGUF's BPE with: added as a special token (at
#: the next id when the vocabulary lacks it) before the file's own tokens.
GPT2_SPECIAL = "<|endoftext|>"

#: The metadata arrays ``bpe_tokenizer_files`` reads (``gguf_header.read_header``).
ARRAYS = TOKENIZER_ARRAYS

#: ``(config key, default text, GGUF id key)`` of the special tokens, in
#: transformers' order.
SPECIAL_IDS: tuple[tuple[str, str | None, str | None], ...] = (
    ("bos_token", None, "bos_token_id"),
    ("eos_token", None, "eos_token_id"),
    ("unk_token", None, "unknown_token_id"),
    ("pad_token", None, "padding_token_id"),
)


def _byte_alphabet() -> dict[int, str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return bytes_to_unicode()


def special_texts(
    meta: dict[str, Any],
    tokens: Sequence[str],
    specials: Sequence[tuple[str, str | None, str | None]] = SPECIAL_IDS,
) -> dict[str, str | None] | None:
    """The special tokens' texts by config key: ``tokens[id]`` of each
    ``(config key, default text, GGUF id key)`` in ``specials``, the default
    where the file (or the entry) has no id key; None when an id is not an
    index of ``tokens``."""
    out: dict[str, str | None] = {}
    for name, default, key in specials:
        value = meta.get(f"tokenizer.ggml.{key}") if key is not None else None
        if value is None:
            out[name] = default
        elif isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(tokens):
            out[name] = tokens[value]
        else:
            return None
    return out


def _added_tokens(
    tokens: Sequence[str],
    types: Sequence[int],
    vocab: dict[str, int],
    spelled: Callable[[str], bool],
    specials: dict[str, str | None],
) -> list[tuple[int, str, bool]] | None:
    """The added tokens ``(id, content, special)`` in id order, as
    transformers adds them; ``spelled`` tells a token written in the byte
    alphabet. None when a special token is in neither the vocabulary nor
    the added tokens, or when a user-defined token was added as special
    before (``tokenizers`` then saves it plain but keeps treating it as
    special in memory, so no file equals transformers' tokenizer)."""
    ids = dict(vocab)
    ids.setdefault(GPT2_SPECIAL, len(tokens))
    added: dict[str, bool] = {GPT2_SPECIAL: True}  # content -> special
    for token, kind in zip(tokens, types, strict=False):
        if kind == CONTROL and spelled(token):
            added[token] = True
    for token, kind in zip(tokens, types, strict=False):
        if kind == USER_DEFINED and token in ids:
            if added.get(token):  # special in memory, plain when saved: left to transformers
                return None
            added[token] = False
    for text in specials.values():
        if text is not None and text not in added:
            if text not in ids:
                return None
            added[text] = True
    return sorted((ids[content], content, special) for content, special in added.items())


def _json_text(
    pipeline: dict[str, Any],
    added: list[tuple[int, str, bool]],
    vocab: dict[str, int],
    merges: list[list[str]],
) -> str:
    """tokenizer.json's text: ``pipeline`` with the added tokens, vocabulary
    and merges in place (written item by item: ``json.dumps`` of a 10^5-key
    dict is several times slower)."""
    quote = json.encoder.encode_basestring
    flags = '"single_word":false,"lstrip":false,"rstrip":false,"normalized":false'
    added_text = ",".join(
        f'{{"id":{i},"content":{quote(c)},{flags},"special":{"true" if s else "false"}}}'
        for i, c, s in added
    )
    vocab_text = ",".join([f"{quote(t)}:{i}" for t, i in vocab.items()])
    model = {k: v for k, v in pipeline["model"].items() if k not in ("vocab", "merges")}
    rest = [
        f"{json.dumps(k)}:{json.dumps(v, ensure_ascii=False)}"
        for k, v in pipeline.items()
        if k not in ("added_tokens", "model")
    ]
    return (
        f'{{"added_tokens":[{added_text}],{",".join(rest)},'
        f'"model":{json.dumps(model, ensure_ascii=False)[:-1]},'
        f'"vocab":{{{vocab_text}}},"merges":{json.dumps(merges, ensure_ascii=False)}}}}}'
    )


def _pipeline(
    specials: dict[str, str | None], vocab: dict[str, int], meta: dict[str, Any]
) -> dict[str, Any]:
    """tokenizer.json without its vocabulary, merges and added tokens, as
    ``tokenizers`` serializes it.

    Raises:
        ValueError: a ``tokenizer.ggml.pre`` that ``gguf_pretok`` refuses.
    """
    from tokenizers import Tokenizer, decoders, models, processors

    tok = Tokenizer(
        models.BPE(
            vocab={}, merges=[], dropout=None, continuing_subword_prefix="", end_of_word_suffix=""
        )
    )
    set_pre_tokenizer(tok, pre_tokenizer(meta))
    tok.decoder = decoders.ByteLevel()
    bos, eos = specials["bos_token"], specials["eos_token"]
    add_bos = meta.get("tokenizer.ggml.add_bos_token") is True and bos is not None
    add_eos = meta.get("tokenizer.ggml.add_eos_token") is True and eos is not None

    def template(seq: str, type_id: int) -> str:
        first = [f"{bos}:{type_id}"] if add_bos else []
        last = [f"{eos}:{type_id}"] if add_eos else []
        return " ".join([*first, f"${seq}:{type_id}", *last])

    single, second = template("A", 0), template("B", 1)
    used = [(t, vocab[t]) for t, on in ((bos, add_bos), (eos, add_eos)) if on and t is not None]
    tok.post_processor = processors.TemplateProcessing(
        single=single, pair=f"{single} {second}", special_tokens=used
    )
    return json.loads(tok.to_str())


def bpe_tokenizer_files(meta: dict[str, Any], class_name: str) -> dict[str, str] | None:
    """``tokenizer.json`` and ``tokenizer_config.json`` (file name -> text)
    of the byte-level BPE in GGUF metadata ``meta`` (read with ``ARRAYS``
    kept), as transformers saves its tokenizer of class ``class_name``; None
    for a file this module leaves to transformers (module docs)."""
    if meta.get("tokenizer.ggml.model") != "gpt2" or class_name not in SUPPORTED_CLASSES:
        return None
    tokens, merges = meta.get(ARRAYS[0]), meta.get(ARRAYS[1])
    if not isinstance(tokens, list) or not isinstance(merges, list) or not tokens:
        return None
    types = meta.get(ARRAYS[2])
    types = [] if types is None or isinstance(types, int) else types.tolist()
    if types and len(types) != len(tokens):
        return None
    pairs = [m.split(" ") for m in merges]
    if any(len(p) != 2 for p in pairs):
        return None
    specials = special_texts(meta, tokens)
    if specials is None:
        return None
    spelling = _byte_alphabet()
    foreign = re.compile("[^" + re.escape("".join(sorted(spelling.values()))) + "]")

    def spelled(token: str) -> bool:
        return foreign.search(token) is None

    vocab = {
        t if spelled(t) else "".join(spelling[b] for b in t.encode("utf-8")): i
        for i, t in enumerate(tokens)
    }
    if len(vocab) != len(tokens):  # a name given twice: ids left to transformers
        return None
    added = _added_tokens(tokens, types, vocab, spelled, specials)
    if added is None:
        return None
    pipeline = _pipeline(specials, vocab, meta)
    from transformers.tokenization_utils_base import VERY_LARGE_INTEGER

    config = {
        "backend": "tokenizers",
        **specials,
        "model_max_length": VERY_LARGE_INTEGER,
        "tokenizer_class": class_name,
        **SUPPORTED_CLASSES[class_name],
    }
    return {
        "tokenizer.json": _json_text(pipeline, added, vocab, pairs),
        "tokenizer_config.json": json.dumps(config, indent=2, sort_keys=True),
    }
