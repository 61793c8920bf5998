"""One way to define a trainer's arguments: a dataclass whose fields document themselves, and
command-line flags generated from those fields.

- ``arg(default, help)``: a dataclass field with its help string;
- ``add_flags(parser, Args, ...)``: one ``--field-name`` flag per field (``--x/--no-x`` for a bool);
- ``given_flags(Args, namespace)``: the fields given on the command line, to build the dataclass.
"""

from __future__ import annotations

import argparse
from dataclasses import field, fields
from typing import Any

_KINDS = {"int": int, "float": float, "str": str}


def arg(default: Any, help: str) -> Any:
    """A dataclass field with a help string (shown by the CLI's ``--help``)."""
    return field(default=default, metadata={"help": help})


def add_flags(
    parser: argparse.ArgumentParser,
    args_cls: type,
    *,
    from_preset: bool,
    aliases: dict[str, list[str]] | None = None,
) -> None:
    """Add ``--field-name`` for every field of the dataclass ``args_cls``.

    With ``from_preset`` every flag defaults to None, meaning "keep the world's preset"; otherwise to
    the field's own default. ``aliases`` maps a field name to extra flags (e.g. ``--env``). A bool
    field gets ``--x`` and ``--no-x``; a tuple field takes one or more values.
    """
    for f in fields(args_cls):
        flags = ["--" + f.name.replace("_", "-"), *(aliases or {}).get(f.name, [])]
        default = None if from_preset else f.default
        kind = str(f.type).replace(" | None", "")
        if kind == "bool":
            parser.add_argument(*flags, default=default, action=argparse.BooleanOptionalAction, help=f.metadata["help"])
            continue
        help_text = f"{f.metadata['help']} (default: {'preset' if from_preset else f.default})"
        if kind.startswith("tuple"):
            parser.add_argument(*flags, nargs="+", default=default, help=help_text)
        else:
            parser.add_argument(*flags, type=_KINDS[kind], default=default, help=help_text)


def given_flags(args_cls: type, namespace: argparse.Namespace) -> dict[str, Any]:
    """The fields of ``args_cls`` given on the command line (not None), tuples as tuples."""
    given = {}
    for f in fields(args_cls):
        value = getattr(namespace, f.name)
        if value is not None:
            given[f.name] = tuple(value) if str(f.type).startswith("tuple") else value
    return given
