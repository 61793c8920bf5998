"""The learner's progress: every verdict is remembered across kernel restarts, listed in notebook order.

The record is a small JSON file, ``{exercise: {"chapter", "status", "when"}}``, in the user's cache
directory (``~/.cache/rlhf-tutorial/progress.json`` on Linux). ``$RLHF_TUTORIAL_PROGRESS_FILE`` points it
elsewhere (tests use a temporary file); set it to ``off`` to record nothing (CI runs the solutions that
way, so they do not mark a learner's exercises as passed). ``reset_progress()`` forgets.
"""

from __future__ import annotations

import html
import json
import os
import time
from pathlib import Path

PROGRESS_ENV_VAR = "RLHF_TUTORIAL_PROGRESS_FILE"
STATUSES = ("passed", "failed", "not tried")
_MARKS = {"passed": "[x]", "failed": "[!]", "not tried": "[ ]"}
_COLOURS = {"passed": "#1a7f37", "failed": "#cf222e", "not tried": "#6e7781"}


def progress_file() -> Path | None:
    """Where verdicts are recorded, or None when recording is off."""
    explicit = os.environ.get(PROGRESS_ENV_VAR, "").strip()
    if explicit:
        return None if explicit.lower() in {"off", "0", "none"} else Path(explicit).expanduser()
    try:
        from platformdirs import user_cache_dir

        base = Path(user_cache_dir("rlhf-tutorial", appauthor=False))
    except ImportError:
        base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rlhf-tutorial"
    return base / "progress.json"


def load() -> dict[str, dict]:
    """The recorded verdicts (empty when there is no record, it is off, or it cannot be read)."""
    path = progress_file()
    if path is None or not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record(name: str, chapter: str, passed: bool) -> None:
    """Remember the latest verdict on exercise ``name``. Never fails the check: a read-only home just
    means nothing is remembered."""
    path = progress_file()
    if path is None:
        return
    data = load()
    data[name] = {"chapter": chapter, "status": "passed" if passed else "failed",
                  "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass


def reset_progress(chapter: str | None = None) -> None:
    """Forget the recorded verdicts of ``chapter`` (a prefix such as "03"), or of every chapter."""
    path = progress_file()
    if path is None or not path.exists():
        return
    data = {n: v for n, v in load().items() if chapter is not None and not str(v.get("chapter", "")).startswith(chapter)}
    path.write_text(json.dumps(data, indent=1, sort_keys=True))


class Progress:
    """Rows of (chapter, exercise, status, minutes) in notebook order; shows as a table per chapter."""

    def __init__(self, rows: list[tuple[str, str, str, int | None]]):
        self.rows = rows

    def by_chapter(self) -> dict[str, list[tuple[str, str, int | None]]]:
        chapters: dict[str, list[tuple[str, str, int | None]]] = {}
        for chapter, name, status, minutes in self.rows:
            chapters.setdefault(chapter, []).append((name, status, minutes))
        return chapters

    @staticmethod
    def _summary(rows: list[tuple[str, str, int | None]]) -> str:
        done = sum(s == "passed" for _, s, _ in rows)
        left = sum(m or 0 for _, s, m in rows if s != "passed")
        return f"{done}/{len(rows)} passed" + (f", about {left} min of exercises left" if left else "")

    def __str__(self) -> str:
        lines = []
        for chapter, rows in self.by_chapter().items():
            lines.append(f"{chapter}: {self._summary(rows)}")
            lines += [f"  {_MARKS[status]} {name}" for name, status, _ in rows]
        return "\n".join(lines) if lines else "no exercises"

    def _repr_pretty_(self, printer, cycle: bool) -> None:  # IPython's text/plain form
        printer.text(str(self))

    def _repr_html_(self) -> str:
        parts = []
        for chapter, rows in self.by_chapter().items():
            cells = "".join(
                f"<span title='{status}' style='display:inline-block;margin:2px 6px 2px 0;padding:1px 6px;"
                f"border-radius:3px;border:1px solid {_COLOURS[status]};color:{_COLOURS[status]}'>"
                f"{'&#10004; ' if status == 'passed' else '&#10008; ' if status == 'failed' else ''}"
                f"<code>{html.escape(name)}</code></span>"
                for name, status, _ in rows
            )
            parts.append(f"<div style='margin:4px 0'><b>{html.escape(chapter)}</b> "
                         f"<span style='color:#6e7781'>{self._summary(rows)}</span><div>{cells}</div></div>")
        return "<div style='font-family:sans-serif'>" + "".join(parts) + "</div>"


def progress(chapter: str | None = None) -> Progress:
    """Every exercise of ``chapter`` (a prefix such as "03"), or of the whole course, with its status:
    passed, failed or not tried, as last checked (remembered across kernel restarts), in notebook order."""
    from rlhf_tutorial.checks.core import REGISTRY, load_all
    from rlhf_tutorial.notebooks import exercises

    load_all()
    recorded = load()
    ordered = [(e.chapter, e.name, e.meta.minutes) for e in exercises()]
    known = {name for _, name, _ in ordered}
    # Exercises with a checker but not in a source here (an installed package without course/).
    ordered += sorted((c.chapter, n, None) for n, c in REGISTRY.items() if n not in known)
    rows = []
    for ch, name, minutes in ordered:
        if chapter is not None and not ch.startswith(chapter):
            continue
        status = recorded.get(name, {}).get("status", "not tried")
        rows.append((ch, name, status if status in STATUSES else "not tried", minutes))
    return Progress(rows)
