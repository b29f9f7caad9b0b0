"""``LoRARegistry``: the adapters loaded in host memory, at most
``max_cpu_loras`` (vLLM's CPU LoRA cache). Loading one more evicts the least
recently used idle adapter (no live request uses it), else the least
recently used one: a live request's adapter evicted from memory is read
again from its folder or file when its request next needs a slot
(``LoRAModelManager``). An id stays bound to its name and path while a live
request uses it or it is loaded.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from .adapter import LoRAAdapter, LoRAError
from .loader import load_adapter
from .request import LoRARequest

__all__ = ["LoRARegistry", "check_lora_request"]


def check_lora_request(req: object) -> LoRARequest:
    """``req`` if it is a well-formed ``LoRARequest``.

    Raises:
        LoRAError: not a ``LoRARequest``, an ``lora_int_id`` below 1, or an
            empty ``lora_name`` / ``lora_path``.
    """
    if not isinstance(req, LoRARequest):
        raise LoRAError(f"lora_request must be a LoRARequest, got {type(req).__name__}")
    if not isinstance(req.lora_int_id, int) or isinstance(req.lora_int_id, bool):
        raise LoRAError(f"lora_int_id must be an integer, got {req.lora_int_id!r}")
    if not 1 <= req.lora_int_id < 2**63:
        raise LoRAError(f"lora_int_id must be >= 1 (0 is the base model), got {req.lora_int_id}")
    if not req.lora_name or not req.lora_path:
        raise LoRAError("a LoRARequest needs a lora_name and a lora_path")
    return req


class LoRARegistry:
    """The loaded adapters, by ``lora_int_id``.

    Args:
        max_cpu_loras: most adapters loaded at once.
        max_lora_rank: the engine's ``max_lora_rank``.
        fit: the adapter as the model runs it, or ``LoRAError`` for one that
            does not fit the model (``LoRAModelManager.fit``).
        on_unload: called with the id of an adapter ``unload`` forgot.
    """

    def __init__(
        self,
        max_cpu_loras: int,
        max_lora_rank: int,
        fit: Callable[[LoRAAdapter], LoRAAdapter],
        on_unload: Callable[[int], None],
    ) -> None:
        self.max_cpu_loras = max_cpu_loras
        self.max_lora_rank = max_lora_rank
        self._fit = fit
        self._on_unload = on_unload
        self._loaded: OrderedDict[int, LoRAAdapter] = OrderedDict()  # oldest use first
        self._requests: dict[int, LoRARequest] = {}
        self._refs: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._loaded)

    def __contains__(self, lora_int_id: int) -> bool:
        return lora_int_id in self._loaded

    def get(self, lora_int_id: int) -> LoRAAdapter:
        """A loaded adapter (``KeyError`` if it is not)."""
        return self._loaded[lora_int_id]

    @property
    def nbytes(self) -> int:
        """Bytes the loaded adapters' matrices hold."""
        return sum(a.nbytes for a in self._loaded.values())

    def request_of(self, lora_int_id: int) -> LoRARequest:
        """The request an id is bound to (``KeyError`` if none)."""
        return self._requests[lora_int_id]

    def loaded(self) -> list[LoRARequest]:
        """The loaded adapters' requests, least recently used first."""
        return [self._requests[i] for i in self._loaded]

    def load(self, req: LoRARequest, pin: bool = False) -> LoRAAdapter:
        """The adapter of ``req``, read now unless it is loaded; marked most
        recently used, and pinned once more with ``pin`` (``release`` unpins).

        Raises:
            LoRAError: a malformed request, an id bound to another name or
                path, or an adapter that cannot be read or does not fit the
                model (``loader.load_adapter``, ``fit``); nothing changes
                then.
        """
        check_lora_request(req)
        i = req.lora_int_id
        known = self._requests.get(i)
        if known is not None and (known.lora_name, known.lora_path) != (
            req.lora_name,
            req.lora_path,
        ):
            raise LoRAError(
                f"lora_int_id {i} is bound to {known.lora_name!r} from "
                f"{known.lora_path!r}, not {req.lora_name!r} from {req.lora_path!r}"
            )
        if i in self._loaded:
            self._loaded.move_to_end(i)
        else:
            adapter = load_adapter(req.lora_path, i, req.lora_name, self.max_lora_rank)
            adapter = self._fit(adapter)
            if len(self._loaded) >= self.max_cpu_loras:
                idle = [v for v in self._loaded if self._refs.get(v, 0) == 0]
                victim = idle[0] if idle else next(iter(self._loaded))
                del self._loaded[victim]
                if not self._refs.get(victim):
                    del self._requests[victim]
            self._loaded[i] = adapter
            self._requests[i] = req
        if pin:
            self._refs[i] = self._refs.get(i, 0) + 1
        return self._loaded[i]

    def release(self, lora_int_id: int) -> None:
        """Unpin one use (a request finished); the adapter stays loaded."""
        n = self._refs.get(lora_int_id, 0) - 1
        if n > 0:
            self._refs[lora_int_id] = n
            return
        self._refs.pop(lora_int_id, None)
        if lora_int_id not in self._loaded:
            self._requests.pop(lora_int_id, None)  # evicted while in use: unbound now

    def unload(self, lora_int_id: int) -> bool:
        """Forget an idle adapter. Returns False when it was not loaded.

        Raises:
            LoRAError: a live request uses it.
        """
        if lora_int_id not in self._loaded:
            return False
        if self._refs.get(lora_int_id, 0):
            raise LoRAError(
                f"adapter {self._requests[lora_int_id].lora_name!r} is in use by "
                f"{self._refs[lora_int_id]} running request(s)"
            )
        self._drop(lora_int_id)
        return True

    def _drop(self, lora_int_id: int) -> None:
        del self._loaded[lora_int_id]
        del self._requests[lora_int_id]
        self._refs.pop(lora_int_id, None)
        self._on_unload(lora_int_id)
