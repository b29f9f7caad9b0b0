"""Checks and fix-ups of a GGUF model file around its load: the file and
its values refused before anything parses them, a config larger than the
tensors refused, transformers' failures on the metadata named, and the
end-of-generation tokens as llama.cpp reads them (``model_loader`` runs
them)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel


def check_gguf_file(path: Path) -> None:
    """Refuse a GGUF file (or split set) that is broken or holds values no
    model can have, before transformers parses it (``quant.gguf_header``,
    ``quant.gguf_split``, ``quant.gguf_check``); the check of the tensors'
    values is remembered per unchanged file (``gguf_cache.values_checked``).

    Raises:
        ValueError: naming the file, the key or tensor, expected and found.
    """
    from .gguf_cache import mark_values_checked, values_checked
    from .quant.gguf_check import check_gguf
    from .quant.gguf_split import read_gguf

    try:
        model = read_gguf(path)
    except OSError as e:
        raise ValueError(f"{path}: cannot read the GGUF file ({e})") from e
    parts = [p.path for p in model.parts]
    checked = values_checked(path, parts)
    check_gguf(model, values=not checked)
    if not checked:
        mark_values_checked(path, parts)


def with_gguf_special_tokens(model: PreTrainedModel, path: Path) -> PreTrainedModel:
    """Set ``model.generation_config``'s ``eos_token_id`` to every
    end-of-generation token of GGUF ``path`` and ``bos_token_id`` to its BOS,
    as llama.cpp reads them (``gguf_tokens``); returns ``model``."""
    from .gguf_tokens import special_tokens

    tokens = special_tokens(path)
    if tokens.eog:
        model.generation_config.eos_token_id = list(tokens.eog)
    if tokens.bos is not None:
        model.generation_config.bos_token_id = tokens.bos
    return model


def check_gguf_config(path: Path, config: Any) -> None:
    """Refuse a GGUF whose metadata makes a model with more parameters than
    its tensors hold values (a size key such as ``<arch>.vocab_size`` or
    ``<arch>.feed_forward_length`` too large), before any real tensor of
    that size is made: the model is built on the meta device and counted.

    A pass is remembered per header and config (``gguf_cache.config_checked``).

    Raises:
        ValueError: naming the file, the parameters expected and found.
    """
    from .gguf_cache import config_checked, mark_config_checked
    from .quant.gguf_split import read_gguf

    model_file = read_gguf(path)
    parts = [p.path for p in model_file.parts]
    if config_checked(path, parts, config):
        return
    held = sum(math.prod(t.dims) for t in model_file.tensors)
    with torch.device("meta"), gguf_errors(path.parent, path.name, "model"):
        meta = AutoModelForCausalLM.from_config(config)
    wanted = sum(p.numel() for p in meta.parameters())
    if wanted > held:
        sizes = {k: getattr(config, k, None) for k in _SIZE_KEYS if hasattr(config, k)}
        raise ValueError(
            f"{path}: the config its metadata gives ({sizes}) makes a model of {wanted:,} "
            f"parameters, but its tensors hold {held:,} values"
        )
    mark_config_checked(path, parts, config)


#: Config fields named in ``check_gguf_config``'s error.
_SIZE_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)


@contextmanager
def gguf_errors(folder: Path, gguf: str | None, what: str) -> Iterator[None]:
    """Re-raise transformers' failures on a checked GGUF file's metadata values
    (a key of the wrong type, a value its converter cannot take, merges that
    name tokens the vocabulary lacks, which ``tokenizers`` raises as a plain
    ``Exception``) as a ``ValueError`` naming the file and ``what`` was being
    built."""
    if gguf is None:
        yield
        return
    try:
        yield
    except Exception as e:  # noqa: BLE001 - transformers and tokenizers (a plain Exception)
        raise ValueError(
            f"{folder / gguf}: transformers cannot build the {what} from the GGUF metadata "
            f"({type(e).__name__}: {e})"
        ) from e
