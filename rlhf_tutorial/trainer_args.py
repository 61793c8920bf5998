"""What the trainers (``ppo``, ``rlhf``, ``grpo``) share about their arguments.

- ``arg(default, help)``: a dataclass field that documents itself;
- ``add_flags(parser, Args, ...)``: one command-line flag per field, with that help;
- ``learner_functions_for(names)``: picks a learner's versions of the pluggable exercises out of a
  notebook's ``globals()``, so a trainer can run the learner's code.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import field, fields
from typing import Any

_KINDS = {"int": int, "float": float, "str": str, "str | None": str, "int | None": int, "float | None": float}


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
    the field's own default. ``aliases`` maps a field name to extra flags (e.g. ``--env``).
    """
    for f in fields(args_cls):
        flags = ["--" + f.name.replace("_", "-"), *(aliases or {}).get(f.name, [])]
        default = None if from_preset else f.default
        if f.type in ("bool", bool):
            parser.add_argument(*flags, default=default, action=argparse.BooleanOptionalAction, help=f.metadata["help"])
            continue
        help_text = f"{f.metadata['help']} (default: {'preset' if from_preset else f.default})"
        if str(f.type).startswith("tuple"):
            parser.add_argument(*flags, nargs="+", default=default, help=help_text)
        else:
            parser.add_argument(*flags, type=_KINDS[str(f.type)], default=default, help=help_text)


def learner_functions_for(names: tuple[str, ...]) -> Callable[[dict], dict[str, Callable]]:
    """The ``learner_functions(namespace)`` of a trainer whose pluggable exercises are ``names``."""

    def learner_functions(namespace: dict) -> dict[str, Callable]:
        """Pick the pluggable exercises out of a namespace: ``train(args, **learner_functions(globals()))``."""
        return {name: namespace[name] for name in names if callable(namespace.get(name))}

    return learner_functions
