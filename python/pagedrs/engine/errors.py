"""Errors the engine raises from a step."""

from __future__ import annotations


class StepFailedError(RuntimeError):
    """A step raised inside the model loop; the scheduler is left consistent.

    Attributes:
        request_ids: the requests that were in the failed step (the caller
            aborts them; every other request is unaffected).
    """

    def __init__(self, message: str, request_ids: list[str]) -> None:
        super().__init__(message)
        self.request_ids = request_ids
