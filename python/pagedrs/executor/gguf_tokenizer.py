"""The tokenizer of a GGUF file: the one transformers makes of it, built once
and kept in pagedrs' cache (``gguf_cache``).

``AutoTokenizer.from_pretrained(folder, gguf_file=...)`` picks the tokenizer
class from the model's config (``TOKENIZER_MAPPING``: ``TokenizersBackend``
for Llama, ``Qwen2Tokenizer`` for Qwen2, ``GemmaTokenizer`` for Gemma 3...),
parsing the whole file's metadata with gguf-py's reader to make that config;
the class then builds the tokenizer from the vocabulary. Here, on a cache
miss:

- the class is the one ``AutoTokenizer`` picks, from the model type of the
  file's architecture (``gguf_archs``) without a second parse; a folder
  holding a ``tokenizer_config.json`` or ``config.json`` beside the file
  (which ``AutoTokenizer`` would read), an architecture pagedrs does not
  know, or Mistral's own tokenizer class go through ``AutoTokenizer`` itself;
- a byte-level BPE (``tokenizer.ggml.model`` ``gpt2``) of a class
  ``gguf_bpe`` writes is written as ``tokenizer.json`` and
  ``tokenizer_config.json`` from the metadata (``gguf_bpe``: the files
  transformers' ``save_pretrained`` writes for its tokenizer of the file),
  with the file's ``tokenizer.chat_template``, then read back as a later
  load reads them (``gguf_cache.load_tokenizer_folder``);
- a Gemma SentencePiece vocabulary (``tokenizer.ggml.model`` ``llama``,
  architecture ``gemma*``) is written the same way (``gguf_spm``: the files
  transformers saves for its ``GemmaTokenizer`` of the file, the merges it
  derives from the vocabulary derived in Rust);
- any other is built by that class from the file
  (``cls.from_pretrained(folder, gguf_file=...)``, transformers' GGUF
  converter) and saved.

A byte-level BPE cuts text as llama.cpp does (``gguf_pretok``), whichever
way it was built: a ``tokenizer.ggml.pre`` pagedrs does not hold is refused.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .gguf_cache import cached_files, load_tokenizer_folder
from .gguf_tokens import special_tokens

logger = logging.getLogger(__name__)

#: The tokenizer's entry in pagedrs' GGUF cache; its name changes with what
#: is written into it, so that no entry of another content is read.
CACHE_KIND = "tokenizer-llama.cpp-pre"

#: Files beside a GGUF that ``AutoTokenizer`` reads for its class or fixes.
_AUTO_FILES = ("tokenizer_config.json", "config.json", "tekken.json")


def tokenizer_class(path: Path) -> type | None:
    """The class ``AutoTokenizer`` builds GGUF ``path``'s tokenizer with, or
    None where only ``AutoTokenizer`` itself can tell (module docs).

    Raises:
        ValueError: a file ``gguf_header.read_header`` refuses.
    """
    from transformers import CONFIG_MAPPING, TokenizersBackend
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING

    from .quant.gguf_archs import GGUF_ARCHS
    from .quant.gguf_header import read_header

    if any((path.parent / name).exists() for name in _AUTO_FILES):
        return None
    header = read_header(path)
    header.buffer.close()
    spec = GGUF_ARCHS.get(str(header.metadata.get("general.architecture")))
    if spec is None or spec.model_type not in CONFIG_MAPPING:
        return None
    cls: Any = TOKENIZER_MAPPING.get(CONFIG_MAPPING[spec.model_type], TokenizersBackend)
    if not isinstance(cls, type) or cls.__name__ == "MistralCommonBackend":
        return None
    return cls


def _write_files(path: Path, cls: type | None, folder: Path) -> bool:
    """Write the tokenizer files of ``path``, a byte-level BPE (``gguf_bpe``)
    or a Gemma SentencePiece vocabulary (``gguf_spm``), into ``folder``;
    False where it leaves the file to transformers."""
    from .gguf_bpe import ARRAYS, bpe_tokenizer_files
    from .gguf_spm import spm_tokenizer_files
    from .quant.gguf_header import read_header

    if cls is None:
        return False
    try:
        header = read_header(path, arrays=ARRAYS)
        header.buffer.close()
        files = bpe_tokenizer_files(header.metadata, cls.__name__)
        if files is None:
            files = spm_tokenizer_files(header.metadata, cls.__name__)
    except Exception as e:  # noqa: BLE001 - left to transformers, which names the error
        logger.info("%s: tokenizer left to transformers (%s: %s)", path, type(e).__name__, e)
        return False
    if files is None:
        return False
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    template = special_tokens(path).chat_template
    if template:
        (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
    return True


def _build(path: Path, cls: type | None) -> Any:
    """transformers' tokenizer of GGUF ``path``, built by class ``cls`` (or
    by ``AutoTokenizer`` when None), with the file's chat template and, for
    a byte-level BPE, llama.cpp's pre-tokenizer (``gguf_pretok``).

    Raises:
        ValueError: a ``tokenizer.ggml.pre`` that ``gguf_pretok`` refuses, or
            metadata transformers cannot build a tokenizer of, naming the file.
    """
    from transformers import AutoTokenizer

    from .gguf_checks import gguf_errors
    from .gguf_metadata import shared_gguf_metadata
    from .gguf_pretok import pre_tokenizer, set_pre_tokenizer
    from .quant.gguf_header import read_header

    header = read_header(path)
    header.buffer.close()
    byte_level = header.metadata.get("tokenizer.ggml.model") == "gpt2"
    try:
        pre = pre_tokenizer(header.metadata) if byte_level else None
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    folder, gguf = path.parent, path.name
    with shared_gguf_metadata(), gguf_errors(folder, gguf, "tokenizer"):
        if cls is None:
            tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
        else:
            tok = cls.from_pretrained(folder, gguf_file=gguf)  # type: ignore[attr-defined]
    if pre is not None:
        set_pre_tokenizer(tok.backend_tokenizer, pre)
    if not getattr(tok, "chat_template", None):
        tok.chat_template = special_tokens(path).chat_template
    return tok


def gguf_tokenizer(path: Path) -> Any:
    """The tokenizer of GGUF file ``path`` (module docs), from pagedrs'
    cache when a file with the same header was loaded before.

    Raises:
        ValueError: an unreadable file, or metadata transformers cannot make
            a tokenizer of (naming the file).
    """
    cls: list[type | None] = []  # the class, looked up on a cache miss only

    def lookup() -> type | None:
        if not cls:
            cls.append(tokenizer_class(path))
        return cls[0]

    return cached_files(
        path,
        CACHE_KIND,
        lambda folder: _write_files(path, lookup(), folder),
        load_tokenizer_folder,
        lambda: _build(path, lookup()),
    )
