"""Plugging a learner's functions into a trainer: one mechanism, one rule, for every trainer.

A trainer (PPO, RLHF, GRPO, the reward model) names the exercises it can run in its ``PLUGGABLE``
tuple; ``train(args, **learner_functions(globals()))`` in a notebook hands it the learner's versions.

**The rule.** An *override* is an object passed under a name in ``PLUGGABLE`` that is not the
reference object itself (a reference handed back, e.g. imported into a notebook, is no override).
Overrides run as they are, with their own globals (the notebook's, where the learner's names are
already the learner's). Every reference *function* of the exercise module runs in one shared
namespace, the module's globals with the overrides in place of the references, so calls chain
through: the reference ``learning_phase`` calls the reference ``compute_rlhf_objective``, which calls
the learner's ``get_logprobs``. Classes, and functions wrapped by a decorator, are used as they are: a reference class or
decorated function must not call a pluggable name.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any


def bind(
    module: types.ModuleType,
    pluggable: tuple[str, ...],
    overrides: dict[str, Any],
    aliases: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Every name of ``pluggable``: the override where there is one, else the reference of ``module``
    rebound so that it calls the overrides (see the module docstring for the rule).

    ``aliases`` maps a name to another pluggable that the shared namespace holds under it (GRPO's
    sequence-level variant: ``{"calc_grpo_objective": "calc_gspo_objective"}``, so that the reference
    ``grpo_step`` optimises GSPO's objective). Raises ``TypeError`` for a name not in ``pluggable``.
    """
    unknown = set(overrides) - set(pluggable)
    if unknown:
        raise TypeError(f"cannot replace {sorted(unknown)}; replaceable: {pluggable}")
    overrides = {name: obj for name, obj in overrides.items() if obj is not getattr(module, name)}
    namespace = dict(vars(module))
    namespace.update(overrides)
    for name, obj in vars(module).items():
        if name not in overrides and isinstance(obj, types.FunctionType) and obj.__globals__ is vars(module):
            namespace[name] = _rebound(obj, namespace)
    bound = {name: namespace[name] for name in pluggable}
    for name, target in (aliases or {}).items():
        namespace[name] = bound[target]
    return bound


def _rebound(fn: types.FunctionType, namespace: dict[str, Any]) -> types.FunctionType:
    """A copy of ``fn`` that looks its global names up in ``namespace``."""
    new = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__doc__ = fn.__doc__
    return new


def learner_functions_for(names: tuple[str, ...]) -> Callable[[dict], dict[str, Callable]]:
    """The ``learner_functions(namespace)`` of a trainer whose pluggable exercises are ``names``."""

    def learner_functions(namespace: dict) -> dict[str, Callable]:
        """Pick the pluggable exercises out of a namespace: ``train(args, **learner_functions(globals()))``."""
        return {name: namespace[name] for name in names if callable(namespace.get(name))}

    return learner_functions
