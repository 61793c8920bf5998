"""Checkers for every exercise, and what a learner calls: ``check``, ``hint`` and ``progress``.

``run_check(name, candidate) -> CheckResult`` is the programmatic entry point (it never raises because
of the candidate); ``check(obj)`` finds the checker by ``obj.__name__`` and shows the verdict as HTML in
Jupyter or as text in a terminal. Checking an untouched stub also raises ``NotImplementedError`` naming
the exercise, so that a chapter's Run All stops at its first exercise not written yet.
"""

from __future__ import annotations

import os
from typing import Any

from rlhf_tutorial.checks import learner_progress as _progress
from rlhf_tutorial.checks.core import (
    NOT_IMPLEMENTED,
    REGISTRY,
    CheckResult,
    chapter_modules,
    hint_rung,
    load_all,
    run_check,
)
from rlhf_tutorial.checks.learner_progress import Progress, progress, reset_progress
from rlhf_tutorial.display import show

__all__ = ["CheckResult", "run_check", "check", "hint", "progress", "reset_progress", "Progress", "load_all",
           "chapter_modules"]


class ExerciseFailed(AssertionError):
    """Raised by ``check`` only in strict mode (RLHF_TUTORIAL_STRICT=1, as CI runs the solutions)."""


def check(obj: Any, name: str | None = None) -> None:
    """Check your solution of an exercise and show the verdict.

    ``obj`` is your function or class; its ``__name__`` names the exercise (pass ``name`` to override).
    """
    name = name or getattr(obj, "__name__", None)
    if name is None:
        result = CheckResult(repr(obj)[:40], False, "pass the function or class itself, e.g. check(whiten).")
    else:
        result = run_check(name, obj)
        if name in REGISTRY:
            _progress.record(name, REGISTRY[name].chapter, result.passed)
    show(result)
    if name is not None and not result.passed and result.message.startswith(NOT_IMPLEMENTED):
        # The untouched stub: stop here, so that Run All stops at the first exercise not written yet (a
        # later cell may not use this one, and would run on past it).
        raise NotImplementedError(f"exercise {name}: not written yet, so Run All stops here. Replace the "
                                  "`raise NotImplementedError(...)` line above, run that cell, then this check.")
    if not result.passed and os.environ.get("RLHF_TUTORIAL_STRICT") == "1":
        raise ExerciseFailed(str(result))


def hint(name: str, rung: int = 1) -> None:
    """Show rung ``rung`` of exercise ``name``'s hint ladder: 1 a nudge (which quantity, which torch
    function), 2 the approach or formula, 3 the code; after a failed check, also what your last attempt
    got wrong."""
    load_all()
    if name not in REGISTRY:
        show(CheckResult(str(name), False, f"there is no exercise called {name!r}. Exercises: {', '.join(REGISTRY)}"))
        return
    if not isinstance(rung, int) or isinstance(rung, bool) or not 1 <= rung <= len(REGISTRY[name].hint):
        show(CheckResult(name, False, f"hint({name!r}, {rung!r}): the rung is 1 (a nudge), 2 (the approach) "
                         f"or 3 (the code)."))
        return
    show(hint_rung(name, rung))
