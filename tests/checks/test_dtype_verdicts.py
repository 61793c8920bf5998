"""Right values in the wrong dtype get their own verdict, for every exercise.

Each exercise's reference (found through the course sources, so no hand-kept list) is wrapped so that
it returns its float32 tensors as float64 and its bool tensors as int64. The checker must then say that
the values are right and name the dtype, and never blame a catalogued mistake. An exercise whose
output holds no float32 or bool tensor (a layer, a memory, a dict of numbers, index tensors) has no
such mistake to make: the wrapper stops the checker at its first call and the test says so.
"""

from __future__ import annotations

import functools
import inspect

import pytest
import torch

from rlhf_tutorial.checks import load_all, run_check
from rlhf_tutorial.checks.core import REGISTRY
from rlhf_tutorial.notebooks import exercise_name, parse_source, resolve, sources

CASTS = {torch.float32: torch.float64, torch.bool: torch.int64}


def _function_exercises() -> list[tuple[str, object]]:
    out = []
    for src in sources():
        for cell in parse_source(src.read_text()):
            if cell.kind == "exercise":
                for ref in cell.refs:
                    obj = resolve(ref)
                    if inspect.isfunction(obj):
                        out.append((exercise_name(ref), obj))
    return out


class NothingToCast(BaseException):
    """Raised through the checker (it catches Exception only) when an output has no castable tensor."""


def _cast(out, found: list[str]):
    if isinstance(out, torch.Tensor) and out.dtype in CASTS:
        found.append(f"{str(out.dtype)[6:]} -> {str(CASTS[out.dtype])[6:]}")
        return out.to(CASTS[out.dtype])
    if isinstance(out, (tuple, list)):
        return type(out)(_cast(x, found) for x in out)
    if isinstance(out, dict):
        return {k: _cast(v, found) for k, v in out.items()}
    return out


def in_wrong_dtype(reference):
    """``reference`` returning float64 for float32 and int64 for bool; stops at an output with neither."""
    casts: list[str] = []

    @functools.wraps(reference)
    def wrapper(*args, **kwargs):
        before = len(casts)
        out = _cast(reference(*args, **kwargs), casts)
        if not casts:
            raise NothingToCast(type(out).__name__)
        assert len(casts) > before, "the reference's outputs changed form between calls"
        return out

    return wrapper, casts


EXERCISES = _function_exercises()


def test_every_exercise_function_is_found_and_checked():
    load_all()
    names = [name for name, _ in EXERCISES]
    assert len(names) >= 30 and all(name in REGISTRY for name in names)


@pytest.mark.parametrize("name, reference", EXERCISES, ids=[n for n, _ in EXERCISES])
def test_right_values_in_the_wrong_dtype_get_the_dtype_verdict(name, reference):
    wrapper, casts = in_wrong_dtype(reference)
    try:
        result = run_check(name, wrapper)
    except NothingToCast as nothing:
        assert not casts, name
        pytest.skip(f"{name} returns {nothing}: no float32 or bool tensor to return in the wrong dtype")
    assert casts, name
    assert not result.passed, f"{name}: float64/int64 output passed"
    bad, good = casts[0].split(" -> ")[1], casts[0].split(" -> ")[0]
    assert f"{bad}: return {good}" in result.message, (name, result.message)
    assert "values are right" in result.message or "wrong dtype" in result.message, (name, result.message)
