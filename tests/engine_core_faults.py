"""Faults in an engine core wherever it runs, for tests of the server's default
(the engine core in its own process, where the test cannot reach the core's
objects).

``FaultyEngineArgs`` are ``EngineArgs`` that, when unpickled (the engine-core
process receives its arguments pickled by ``multiprocessing`` spawn), wrap
that process's ``EngineCore.step`` and ``Sampler.__call__`` before the core is
built: every step takes at least ``step_delay_s``, and a step sampling a row
whose seed is ``poison_seed`` raises ``RuntimeError("poisoned row")`` in the
sampler. The test process itself is left as it is.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from pagedrs import EngineArgs

__all__ = ["FaultyEngineArgs"]


class FaultyEngineArgs(EngineArgs):
    """``EngineArgs`` carrying faults into the engine-core process.

    Args:
        step_delay_s: least seconds a core step takes.
        poison_seed: requests with this ``seed`` fail in the sampler.
        **fields: the ``EngineArgs`` fields.
    """

    def __init__(self, *, step_delay_s: float, poison_seed: int, **fields: Any) -> None:
        super().__init__(**fields)
        self.step_delay_s = step_delay_s
        self.poison_seed = poison_seed

    def __reduce__(self) -> tuple[Any, ...]:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(EngineArgs)}
        return (_args_with_faults, (fields, self.step_delay_s, self.poison_seed))


def _args_with_faults(fields: dict[str, Any], step_delay_s: float, poison_seed: int) -> EngineArgs:
    """Unpickling ``FaultyEngineArgs``: install the faults in this process,
    return plain ``EngineArgs``."""
    from pagedrs.engine.core.engine_core import EngineCore
    from pagedrs.executor.sampler import Sampler

    step, sample = EngineCore.step, Sampler.__call__

    def slow_step(self: EngineCore) -> Any:
        time.sleep(step_delay_s)
        return step(self)

    def poisoned(self: Sampler, logits: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        if (batch.seed == poison_seed).any():
            raise RuntimeError("poisoned row")
        return sample(self, logits, batch, *args, **kwargs)

    EngineCore.step = slow_step  # type: ignore[method-assign]
    Sampler.__call__ = poisoned  # type: ignore[method-assign]
    return EngineArgs(**fields)
