"""Checkers for every exercise, and what a learner calls: ``check``, ``hint`` and ``progress``.

``run_check(name, candidate) -> CheckResult`` is the programmatic entry point (it never raises because
of the candidate); ``check(obj)`` finds the checker by ``obj.__name__`` and shows the verdict as HTML in
Jupyter or as text in a terminal.
"""

from __future__ import annotations

import html
import os
from typing import Any

from rlhf_tutorial.checks.core import (
    REGISTRY,
    RESULTS,
    CheckResult,
    chapter_modules,
    load_all,
    run_check,
)
from rlhf_tutorial.display import show

__all__ = ["CheckResult", "run_check", "check", "hint", "progress", "load_all", "chapter_modules"]


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
    show(result)
    if not result.passed and os.environ.get("RLHF_TUTORIAL_STRICT") == "1":
        raise ExerciseFailed(str(result))


def hint(name: str) -> None:
    """Show the hint of exercise ``name``."""
    load_all()
    text = REGISTRY[name].hint if name in REGISTRY else f"there is no exercise called {name!r}."
    show(f"Hint for {name}: {text}")


class Progress:
    def __init__(self, rows: list[tuple[str, str, str]]):
        self.rows = rows  # (chapter, exercise, status)

    def __str__(self) -> str:
        marks = {"passed": "[x]", "failed": "[!]", "not tried": "[ ]"}
        lines, chapter = [], None
        for ch, name, status in self.rows:
            if ch != chapter:
                chapter = ch
                lines.append(ch)
            lines.append(f"  {marks[status]} {name}")
        return "\n".join(lines) if lines else "no exercises"

    def _repr_pretty_(self, printer, cycle: bool) -> None:  # IPython's text/plain form
        printer.text(str(self))

    def _repr_html_(self) -> str:
        colours = {"passed": "#1a7f37", "failed": "#cf222e", "not tried": "#6e7781"}
        body = "".join(
            f"<tr><td>{html.escape(ch)}</td><td><code>{html.escape(n)}</code></td>"
            f"<td style='color:{colours[s]}'>{s}</td></tr>"
            for ch, n, s in self.rows
        )
        return f"<table><tr><th>chapter</th><th>exercise</th><th>status</th></tr>{body}</table>"


def progress(chapter: str | None = None) -> Progress:
    """Which exercises (of ``chapter``, or of all chapters) have passed in this kernel."""
    load_all()
    rows = []
    for name, entry in REGISTRY.items():
        if chapter is not None and not entry.chapter.startswith(chapter):
            continue
        status = "not tried" if name not in RESULTS else ("passed" if RESULTS[name] else "failed")
        rows.append((entry.chapter, name, status))
    rows.sort(key=lambda r: r[0])
    return Progress(rows)
