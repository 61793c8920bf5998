"""Assertions shared by the checker tests."""

from rlhf_tutorial.checks import run_check


def assert_fails_with(name: str, candidate, fragment: str) -> None:
    """The checker of ``name`` rejects ``candidate`` and its message or hint contains ``fragment``."""
    result = run_check(name, candidate)
    assert not result.passed, f"{name}: a wrong implementation passed"
    text = f"{result.message}\n{result.hint}"
    assert fragment in text, f"{name}: expected {fragment!r} in:\n{text}"
