"""The command-line form of a configuration dataclass (``EngineArgs``): one
flag ``--field-name`` per field, its type from the annotation, its default
from the field, its help from the class docstring's ``Attributes:`` section."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import types
import typing
from typing import Any


def field_docs(cls: type) -> dict[str, str]:
    """Each field's entry in the ``Attributes:`` section of ``cls``' docstring,
    continuation lines joined with spaces."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    _, _, section = doc.partition("Attributes:\n")
    docs: dict[str, str] = {}
    name = None
    for line in section.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        head, sep, text = line.strip().partition(": ")
        if indent <= 4 and sep and head.isidentifier():
            name = head
            docs[name] = text.strip()
        elif indent > 4 and name is not None:
            docs[name] += " " + line.strip()
        else:
            break
    return docs


def add_dataclass_flags(
    cls: type,
    parser: argparse.ArgumentParser,
    choices: dict[str, tuple[str, ...]],
    *,
    title: str,
    positional_model: bool = False,
) -> argparse.ArgumentParser:
    """Add a flag ``--field-name`` for every field of the dataclass ``cls``,
    in an argument group named ``title``: type from the annotation
    (``X | None`` is optional ``X``; a bool is ``--flag / --no-flag``),
    default from the field, help from the ``Attributes:`` docstring (with
    the default unless it is None), ``choices`` from ``choices``.

    Args:
        cls: a dataclass whose fields all have defaults.
        parser: the parser (or argument group's parser) to extend.
        choices: the fixed value set of a field, by field name.
        title: the argument group's title.
        positional_model: make ``model`` an optional positional argument
            (``pagedrs serve MODEL``) instead of ``--model``.

    Returns:
        ``parser``.

    Raises:
        TypeError: a field whose annotation has no command-line form.
    """
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    group = parser.add_argument_group(title)
    for f in dataclasses.fields(cls):
        help_text = docs.get(f.name, "").replace("%", "%%")
        if f.default is not None:  # a None default is described by the docstring
            help_text += " (default: %(default)s)"
        kwargs: dict[str, Any] = {"default": f.default, "help": help_text.strip()}
        base = cli_type(f"{cls.__name__}.{f.name}", hints[f.name])
        if base is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = base
            if f.name in choices:
                kwargs["choices"] = choices[f.name]
            else:
                kwargs["metavar"] = f.name.upper()
        if f.name == "model" and positional_model:
            group.add_argument("model", nargs="?", **kwargs)
        else:
            group.add_argument("--" + f.name.replace("_", "-"), **kwargs)
    return parser


def cli_type(name: str, hint: Any) -> type:
    """The command-line type of the field ``name`` annotated ``hint``: ``int``,
    ``float``, ``str`` or ``bool``, unwrapping ``X | None``; a field that
    takes text or a dict (``speculative_config``) takes its JSON text.

    Raises:
        TypeError: any other annotation, naming the field.
    """
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            hint = args[0]
        elif str in args:  # text or a dict in Python: the JSON text on the command line
            hint = str
    if hint in (int, float, str, bool):
        return hint
    raise TypeError(f"{name}: no command-line form for the annotation {hint!r}")
