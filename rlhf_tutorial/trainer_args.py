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


#: How a trainer's GPT-2 preset changes with the model's size (``RLHF_TUTORIAL_GPT2``). The directions
#: are the seed blog's ("scaling": for larger models reduce the learning rates, the gradient clipping
#: and the PPO parameters; reduce the KL coefficient and raise the KL threshold, since larger models
#: handle more divergence; fewer phases with a longer warm-up, since they converge faster but need a
#: more careful start). The blog trains gpt2 to gpt2-xl but publishes no per-size numbers, so the
#: magnitudes are ours and untuned (no GPT-2 weights here; treat them as starting points):
#:
#: - ``lr_scale``: learning rates times sqrt(124M / parameters) (medium 355M: 0.59, large 774M: 0.40,
#:   xl 1558M: 0.28), rounded to one digit: the usual square-root rule for Adam with width;
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
