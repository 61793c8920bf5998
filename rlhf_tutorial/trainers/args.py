"""One way to define a trainer's arguments: a dataclass whose fields document themselves, and
command-line flags generated from those fields.

- ``arg(default, help)``: a dataclass field with its help string;
- ``@documented`` (above ``@dataclass``): the fields' help strings appended to the class docstring, so
  ``help(Args)`` in a notebook shows what each knob means, as the CLI's ``--help`` does;
- ``add_flags(parser, Args, ...)``: one ``--field-name`` flag per field (``--x/--no-x`` for a bool);
- ``given_flags(Args, namespace)``: the fields given on the command line, to build the dataclass;
- ``parse_command(prog, Args, argv, ...)``: a command's whole parser: the fields' flags, ``--threads``
  (applied to torch) and ``--no-progress``.
"""

from __future__ import annotations

import argparse
from dataclasses import field, fields
from typing import Any

_KINDS = {"int": int, "float": float, "str": str}


def arg(default: Any, help: str) -> Any:
    """A dataclass field with a help string (shown by the CLI's ``--help``)."""
    return field(default=default, metadata={"help": help})


def documented(args_cls: type) -> type:
    """Append a ``Fields:`` section to the dataclass ``args_cls``'s docstring, one line per field:
    ``name (type, default D): help``, the help string of :func:`arg`. Apply it above ``@dataclass``
    (it reads the fields), so that ``help(Args)`` and ``Args?`` describe every knob."""
    lines = [f"        {f.name} ({f.type}, default {f.default!r}): {f.metadata.get('help', '')}"
             for f in fields(args_cls)]
    args_cls.__doc__ = (args_cls.__doc__ or args_cls.__name__).rstrip() + "\n\n    Fields:\n" + "\n".join(lines) + "\n"
    return args_cls


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
        described = f.metadata["help"].replace("%", "%%")  # argparse formats help strings with %
        if kind == "bool":
            parser.add_argument(*flags, default=default, action=argparse.BooleanOptionalAction, help=described)
            continue
        help_text = f"{described} (default: {'preset' if from_preset else f.default})"
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


def parse_command(prog: str, args_cls: type, argv: list[str], *, description: str | None, from_preset: bool,
                  threads_help: str = "torch CPU threads") -> argparse.Namespace:
    """Parse ``argv`` of ``python -m rlhf_tutorial {prog}``: one flag per field of ``args_cls``
    (:func:`add_flags`; ``from_preset``: a flag not given is None, keeping the world's preset), plus
    ``--threads N`` (default 1, set with ``torch.set_num_threads`` here) and ``--no-progress``. Build the
    dataclass with :func:`given_flags`."""
    import torch

    parser = argparse.ArgumentParser(prog=f"python -m rlhf_tutorial {prog}", description=description)
    add_flags(parser, args_cls, from_preset=from_preset)
    parser.add_argument("--threads", type=int, default=1, help=threads_help)
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    ns = parser.parse_args(argv)
    torch.set_num_threads(ns.threads)
    return ns


#: How a trainer's GPT-2 preset changes with the model's size (``RLHF_TUTORIAL_GPT2``). The directions
#: are the seed blog's ("scaling": for larger models reduce the learning rates, the gradient clipping
#: and the PPO parameters; reduce the KL coefficient and raise the KL threshold, since larger models
#: handle more divergence; fewer phases with a longer warm-up, since they converge faster but need a
#: more careful start). The blog trains gpt2 to gpt2-xl but publishes no per-size numbers, so the
#: magnitudes are ours and untuned (no GPT-2 weights here; treat them as starting points):
#:
#: - ``lr_scale``: learning rates times sqrt(124M / parameters) (medium 355M: 0.59, large 774M: 0.40,
#:   xl 1558M: 0.28), rounded to one digit: a heuristic of ours, not an established rule (muP scales
#:   the Adam learning rate of hidden matrices as 1 / width);
#: - ``max_grad_norm``: 0.5 (the blog's gpt2 value, from 1.0) tightened by 0.1 a size, 0.25 at most;
#: - ``clip_scale``: the surrogate's clip range (PPO's 0.3, GRPO's 0.2) times 0.85 / 0.7 / 0.7;
#: - ``kl_scale`` / ``kl_threshold_scale``: the KL coefficient down and the early-stopping threshold
#:   (and the adaptive target with it) up, in steps of about a quarter;
#: - ``phases`` / ``warmup``: 200 phases with 20 warm-up (the blog's gpt2 runs), then 150 / 25,
#:   120 / 30, 100 / 30.
GPT2_SCALING: dict[str, dict[str, float]] = {
    "gpt2": dict(lr_scale=1.0, max_grad_norm=0.5, clip_scale=1.0, kl_scale=1.0, kl_threshold_scale=1.0,
                 phases=200, warmup=20),
    "gpt2-medium": dict(lr_scale=0.6, max_grad_norm=0.4, clip_scale=0.85, kl_scale=0.75, kl_threshold_scale=1.2,
                        phases=150, warmup=25),
    "gpt2-large": dict(lr_scale=0.4, max_grad_norm=0.3, clip_scale=0.7, kl_scale=0.6, kl_threshold_scale=1.5,
                       phases=120, warmup=30),
    "gpt2-xl": dict(lr_scale=0.3, max_grad_norm=0.25, clip_scale=0.7, kl_scale=0.5, kl_threshold_scale=1.5,
                    phases=100, warmup=30),
}


def gpt2_size_presets(gpt2: dict[str, Any], names: dict[str, tuple[str, ...]]) -> dict[str, dict[str, Any]]:
    """The presets of every GPT-2 size from a trainer's ``gpt2`` preset and :data:`GPT2_SCALING`.

    ``names`` maps each scaling key (``lr_scale``, ``max_grad_norm``, ``clip_scale``, ``kl_scale``,
    ``kl_threshold_scale``, ``phases``, ``warmup``) to the trainer's fields it sets; a ``*_scale``
    multiplies the ``gpt2`` value, the others replace it. Keys a trainer lacks are left out of ``names``.
    """
    presets = {}
    for size, scaling in GPT2_SCALING.items():
        preset = dict(gpt2)
        for key, fields_of_key in names.items():
            for name in fields_of_key:
                preset[name] = (round(gpt2[name] * scaling[key], 10) if key.endswith("_scale")
                                else type(gpt2[name])(scaling[key]))
        presets[size] = preset
    return presets
