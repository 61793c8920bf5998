"""No parameter of an exercise goes unexercised: registry-driven.

For every function exercise (classes are constructed, not called with cases), the checker is run once
on a spy of the reference that records the arguments it is called with. Then, for every parameter that
has a default or that the checker passes as a number, each version of the reference that ignores that
parameter (calls the reference with one fixed value instead: the default, or any value the checker
used) must be rejected. A parameter whose value never changes anything measurable fails here: add a
case where it matters (``calc_clipped_surrogate_objective`` once accepted code that ignored ``eps``).
"""

from __future__ import annotations

import inspect

import pytest
import torch

from rlhf_tutorial.checks import load_all, run_check
from rlhf_tutorial.notebooks import exercise_name, resolve
from tests.checks.test_exercise_manifest import MANIFEST

FUNCTIONS = [exercise_name(ref) for _, ref in MANIFEST if not isinstance(resolve(ref), type)]
REFERENCES = {exercise_name(ref): resolve(ref) for _, ref in MANIFEST}


def _counts(value, parameter: inspect.Parameter) -> bool:
    """Whether a parameter holding ``value`` is one to test: a number, or anything in a parameter with
    a default (a tensor or a module is an input, not a setting)."""
    if isinstance(value, (torch.Tensor, torch.nn.Module)):
        return False
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return numeric or parameter.default is not inspect.Parameter.empty


def fixed_values(name: str) -> dict[str, list]:
    """For each parameter to test, the values a version that ignores it might use instead: its default
    and every number the checker passed."""
    reference = REFERENCES[name]
    signature = inspect.signature(reference)
    seen: dict[str, dict[str, object]] = {}

    def spy(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        for key, value in bound.arguments.items():
            parameter = signature.parameters[key]
            if _counts(value, parameter):
                values = seen.setdefault(key, {})
                if parameter.default is not inspect.Parameter.empty:
                    values[repr(parameter.default)] = parameter.default
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    values[repr(value)] = value
        return reference(*args, **kwargs)

    result = run_check(name, spy)
    assert result.passed, f"{name}: the reference behind a spy failed: {result.message}"
    return {key: list(values.values()) for key, values in seen.items()}


def ignoring(reference, parameter: str, value):
    """The reference, called with ``parameter`` always ``value``, whatever it was given."""
    signature = inspect.signature(reference)

    def fn(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.arguments[parameter] = value
        return reference(*bound.args, **bound.kwargs)

    return fn


@pytest.mark.cpu_only  # the CPU pass judges a wrong version first (see test_contract_clauses): no GPU pass runs
@pytest.mark.parametrize("name", FUNCTIONS)
def test_a_version_that_ignores_a_parameter_is_rejected(name):
    load_all()
    survivors = []
    for parameter, values in fixed_values(name).items():
        for value in values:
            if run_check(name, ignoring(REFERENCES[name], parameter, value)).passed:
                survivors.append(f"{parameter} fixed at {value!r}")
    assert not survivors, f"{name}: versions that ignore a parameter pass the checker: {survivors}"


def test_the_audit_sees_the_parameters_it_should():
    """The spy records what the checkers pass: eps of the clipped surrogate with its default and 1e-3."""
    values = fixed_values("calc_clipped_surrogate_objective")
    assert sorted(values["eps"]) == [1e-8, 1e-3] and 0.1 in values["clip_coef"]
    assert set(fixed_values("dpo_loss")) == {"beta", "loss_type", "label_smoothing"}
