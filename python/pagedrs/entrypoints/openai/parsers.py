"""The parser registries' one lookup: a parser class by the name of a server
setting (``--reasoning-parser``, ``--tool-call-parser``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

P = TypeVar("P")


def make_parser(registry: Mapping[str, type[P]], setting: str, name: str) -> P:
    """A new parser of the class ``registry`` holds under ``name``.

    Raises:
        ValueError: an unknown name; the message names ``setting`` and lists
            the known names.
    """
    if name not in registry:
        raise ValueError(f"{setting} {name!r} is not one of {sorted(registry)}")
    return registry[name]()
