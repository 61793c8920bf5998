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

**Gradients.** Training differentiates the outputs of the exercises named in :data:`DIFFERENTIATED`.
A learner's version of one of them that returns a tensor without a graph (a ``.detach()``, an
``.item()`` rebuilt into a tensor, a body under ``torch.no_grad()``) would make the trainer die in
``backward()`` with torch's "element 0 of tensors does not require grad", far from the cause:
:func:`bind` wraps such an override so that the trainer stops at once with
:class:`NoGradientError`, naming the function.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import torch

#: The exercises whose output training differentiates, with the inputs the gradient flows back
#: through (an argument name of the contract; "model" for a module's parameters). Their checkers
#: compare the gradient as well as the value (``checks.core.compare_gradients``), and a trainer stops
#: with the function's name when its plugged version loses the graph.
DIFFERENTIATED: dict[str, tuple[str, ...]] = {
    # chapter 01
    "calc_clipped_surrogate_objective": ("logprobs",),
    "calc_value_function_loss": ("values",),
    "calc_entropy_bonus": ("logits",),
    # chapter 02
    "bradley_terry_loss": ("chosen_rewards", "rejected_rewards"),
    "pool_last_token": ("x",),
    "pool_mean": ("x",),
    # chapter 03
    "get_logprobs": ("logits",),
    "calc_kl_penalty": ("logits",),
    "approx_kl": ("logprobs",),
    "compute_rlhf_objective": ("model",),
    # chapter 04
    "calc_grpo_objective": ("logprobs",),
    "cispo_objective": ("logprobs",),
    # chapter 06
    "sequence_logprobs": ("logits",),
    "dpo_loss": ("policy_chosen_logps", "policy_rejected_logps"),
    "simpo_loss": ("chosen_logps", "rejected_logps"),
    "kto_loss": ("policy_logps",),
    "orpo_loss": ("chosen_logps", "rejected_logps"),
    "gspo_sequence_ratio": ("logprobs",),
}


class NoGradientError(RuntimeError):
    """A learner's plugged function returned a tensor without a graph where training needs one."""


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
    overrides = {name: _guarded(name, obj) if name in DIFFERENTIATED else obj
                 for name, obj in overrides.items() if obj is not getattr(module, name)}
    namespace = dict(vars(module))
    namespace.update(overrides)
    for name, obj in vars(module).items():
        if name not in overrides and isinstance(obj, types.FunctionType) and obj.__globals__ is vars(module):
            namespace[name] = _rebound(obj, namespace)
    bound = {name: namespace[name] for name in pluggable}
    for name, target in (aliases or {}).items():
        namespace[name] = bound[target]
    return bound


def _tensors(obj: Any) -> list[torch.Tensor]:
    """The tensors of ``obj``: itself, or those in a tuple, list or dict (one level per container)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in _tensors(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in _tensors(x)]
    return []


def _tracks_gradients(args: tuple, kwargs: dict) -> bool:
    """Whether an input of a call carries gradients: a tensor that requires grad, or a module with a
    parameter that does."""
    for x in (*args, *kwargs.values()):
        if isinstance(x, torch.nn.Module) and any(p.requires_grad for p in x.parameters()):
            return True
        if any(t.requires_grad for t in _tensors(x)):
            return True
    return False


def _guarded(name: str, fn: Any) -> Any:
    """``fn`` (a learner's version of a :data:`DIFFERENTIATED` exercise) that raises
    :class:`NoGradientError` when, with gradients on and an input that carries them, none of its
    floating-point outputs does."""
    if not callable(fn) or isinstance(fn, type):
        return fn

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        floats = [t for t in _tensors(out) if t.is_floating_point()]
        if floats and torch.is_grad_enabled() and _tracks_gradients(args, kwargs) and not any(
                t.requires_grad for t in floats):
            raise NoGradientError(
                f"your `{name}` returned a tensor with no gradient graph although its input carries gradients: "
                "something in it detached the result (`.detach()`, `.item()` or `torch.tensor(...)` of a result, "
                "`.numpy()`, or a body under `torch.no_grad()`). Training backpropagates through it, so it cannot "
                f"go on. Run check(\"{name}\", {name}) to find where.")
        return out

    return guarded


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
