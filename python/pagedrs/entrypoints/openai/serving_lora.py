"""LoRA adapters served by name (vLLM's ``--lora-modules``): the adapter's
name is the request's ``model``, ``/v1/models`` lists them after the base
model, and with ``PAGEDRS_ALLOW_RUNTIME_LORA_UPDATING`` set (vLLM's
``VLLM_ALLOW_RUNTIME_LORA_UPDATING``) ``POST /v1/load_lora_adapter`` and
``/v1/unload_lora_adapter`` change them while serving.

An adapter is read and checked here before it is named (a corrupt file is a
400 naming it, and nothing changes); the engine core loads it again when a
request first uses it, and checks its shapes against the model then.
"""

from __future__ import annotations

import asyncio
import itertools
import os

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from ...lora.adapter import LoRAError
from ...lora.loader import load_adapter
from ...lora.request import LoRARequest
from .errors import OpenAIError
from .protocol import ModelCard

__all__ = [
    "ALLOW_RUNTIME_LORA_UPDATING",
    "LoRAModules",
    "add_lora_routes",
    "parse_lora_modules",
    "runtime_updating_allowed",
]

#: The environment variable that turns the load / unload endpoints on.
ALLOW_RUNTIME_LORA_UPDATING = "PAGEDRS_ALLOW_RUNTIME_LORA_UPDATING"


def runtime_updating_allowed() -> bool:
    """Whether ``PAGEDRS_ALLOW_RUNTIME_LORA_UPDATING`` is "1" or "true"."""
    return os.environ.get(ALLOW_RUNTIME_LORA_UPDATING, "").strip().lower() in ("1", "true")


def parse_lora_modules(values: list[str]) -> list[tuple[str, str]]:
    """``--lora-modules`` entries ``name=path`` as (name, path) pairs.

    Raises:
        ValueError: an entry without ``=``, an empty name or path, or a name
            given twice.
    """
    pairs: list[tuple[str, str]] = []
    for v in values:
        name, sep, path = v.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"--lora-modules entries are name=path, got {v!r}")
        if any(n == name.strip() for n, _ in pairs):
            raise ValueError(f"--lora-modules names {name.strip()!r} twice")
        pairs.append((name.strip(), path.strip()))
    return pairs


class LoadLoRAAdapterRequest(BaseModel):
    """Body of ``POST /v1/load_lora_adapter`` (vLLM's)."""

    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(BaseModel):
    """Body of ``POST /v1/unload_lora_adapter`` (vLLM's)."""

    lora_name: str
    lora_int_id: int | None = None


class LoRAModules:
    """The adapters served by name; each gets the next ``lora_int_id`` (from 1).

    Args:
        base_model_names: the base model's served names (an adapter may not
            take one).
        max_lora_rank: the engine's ``max_lora_rank``.
        modules: (name, PEFT folder or GGUF LoRA file) pairs served from the
            start.
    Raises:
        ValueError: an adapter that cannot be read (naming the file or
            field), or a name taken.
    """

    def __init__(
        self,
        base_model_names: list[str],
        max_lora_rank: int,
        modules: list[tuple[str, str]] = (),  # type: ignore[assignment]
    ) -> None:
        self.base_model_names = list(base_model_names)
        self.max_lora_rank = max_lora_rank
        self._by_name: dict[str, LoRARequest] = {}
        self._ids = itertools.count(1)
        for name, path in modules:
            self._check_name(name)
            self._read(name, path)
            self._by_name[name] = LoRARequest(name, next(self._ids), path)

    def names(self) -> list[str]:
        """The adapters' names, in the order they were added."""
        return list(self._by_name)

    def request_of(self, model: str) -> LoRARequest | None:
        """The ``LoRARequest`` of an adapter name, None for any other name."""
        return self._by_name.get(model)

    def cards(self, root: str | None) -> list[ModelCard]:
        """``/v1/models`` entries of the adapters (``root``: their folder or file)."""
        return [ModelCard(id=n, root=r.lora_path) for n, r in self._by_name.items()]

    def _check_name(self, name: str) -> None:
        if name in self._by_name or name in self.base_model_names:
            raise ValueError(f"the model name {name!r} is already served")

    def _read(self, name: str, path: str) -> None:
        """Read and check the adapter (``lora.loader.load_adapter``: a PEFT
        folder or a GGUF LoRA file)."""
        load_adapter(path, 0, name, self.max_lora_rank)

    async def load(self, body: LoadLoRAAdapterRequest) -> str:
        """Serve one more adapter under ``body.lora_name``.

        Raises:
            OpenAIError: 400 for a name already served, or an adapter that
                cannot be read (naming the file or field); nothing changes then.
        """
        try:
            self._check_name(body.lora_name)
            await asyncio.to_thread(self._read, body.lora_name, body.lora_path)
            self._check_name(body.lora_name)  # another load may have taken it meanwhile
        except LoRAError as e:
            raise OpenAIError(400, str(e), param="lora_path") from None
        except ValueError as e:
            raise OpenAIError(400, str(e), param="lora_name") from None
        self._by_name[body.lora_name] = LoRARequest(body.lora_name, next(self._ids), body.lora_path)
        return f"Success: LoRA adapter '{body.lora_name}' added successfully."

    def unload(self, body: UnloadLoRAAdapterRequest) -> str:
        """Stop serving an adapter (requests running with it finish; the
        engine evicts it from memory when others need the room).

        Raises:
            OpenAIError: 404 for a name not served.
        """
        if self._by_name.pop(body.lora_name, None) is None:
            raise OpenAIError(
                404,
                f"The LoRA adapter `{body.lora_name}` is not served",
                param="lora_name",
                code="model_not_found",
            )
        return f"Success: LoRA adapter '{body.lora_name}' removed successfully."


def add_lora_routes(app: FastAPI, modules: LoRAModules) -> None:
    """``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``."""

    @app.post("/v1/load_lora_adapter", response_model=None)
    async def load_lora_adapter(body: LoadLoRAAdapterRequest) -> PlainTextResponse:
        return PlainTextResponse(await modules.load(body))

    @app.post("/v1/unload_lora_adapter", response_model=None)
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest) -> PlainTextResponse:
        return PlainTextResponse(modules.unload(body))
