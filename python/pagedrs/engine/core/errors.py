"""Errors of the engine: a request refused before it runs, a step that failed."""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request refused before anything of it ran (bad prompt, parameters or id).

    The OpenAI-compatible server answers it with a 400 whose body carries
    ``param`` and ``code`` as they are.

    Attributes:
        param: the request field at fault (e.g. ``"prompt"``, ``"top_p"``), or None.
        code: a machine-readable code (e.g. ``"context_length_exceeded"``), or None.
    """

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class StepFailedError(RuntimeError):
    """A step raised inside the model loop; the scheduler is left consistent.

    Attributes:
        request_ids: the requests that were in the failed step (the caller
            aborts them; every other request is unaffected).
    """

    def __init__(self, message: str, request_ids: list[str]) -> None:
        super().__init__(message)
        self.request_ids = request_ids
