"""The learner's progress: every verdict is remembered across kernel restarts, listed in notebook order.

The record is a small JSON file, ``{exercise: {"chapter", "status", "when", "first_check",
"checks", "seconds_to_pass"}}``, in the user's cache directory (``~/.cache/rlhf-tutorial/progress.json`` on Linux). ``$RLHF_TUTORIAL_PROGRESS_FILE`` points it
elsewhere (tests use a temporary file); set it to ``off`` to record nothing (CI runs the solutions that
way, so they do not mark a learner's exercises as passed). ``reset_progress()`` forgets.

**Time taken.** The first check of an exercise starts its clock (``first_check``, seconds since the
epoch); the first passing check stops it: ``seconds_to_pass`` = that check's time - ``first_check``, and
``checks`` counts the checks up to it. Later checks change neither. ``progress()`` shows the minutes
beside the estimate, so the course can learn its own estimates (docs/AUTHORING.md, "Estimates"). It
measures from the first check, not from the first look at the exercise: an exercise passed at its first
check records 0.
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


def _now() -> float:
    """The clock of the records (seconds since the epoch); tests replace it."""
    return time.time()


def _number(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x == x else None


def record(name: str, chapter: str, passed: bool) -> None:
    """Remember the latest verdict on exercise ``name``, and the time from its first check to its first
    pass. Never fails the check: a read-only home (or an unreadable record) just means nothing is
    remembered."""
    path = progress_file()
    if path is None:
        return
    data = load()
    now = _now()
    before = data.get(name) if isinstance(data.get(name), dict) else {}
    first = _number(before.get("first_check"))
    taken = _number(before.get("seconds_to_pass"))
    checks = int(_number(before.get("checks")) or 0)
    entry = {"chapter": chapter, "status": "passed" if passed else "failed",
             "when": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)),
             "first_check": now if first is None else first}
    if taken is None:  # the clock runs until the first pass
        checks += 1
        if passed:
            taken = max(0.0, now - entry["first_check"])
    entry["checks"] = checks
    if taken is not None:
        entry["seconds_to_pass"] = round(taken, 1)
    data[name] = entry
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


def _minutes(seconds: float | None) -> int | None:
    """Whole minutes, rounded up (a pass 20 s after the first check took "1 min"; exactly 0 s, 0)."""
    return None if seconds is None else int(-(-seconds // 60))


class Progress:
    """Rows of (chapter, exercise, status, estimated minutes, seconds from the first check to the first
    pass) in notebook order; shows as a table per chapter."""

    def __init__(self, rows: list[tuple[str, str, str, int | None, float | None]]):
        self.rows = rows

    def by_chapter(self) -> dict[str, list[tuple[str, str, int | None, float | None]]]:
        chapters: dict[str, list[tuple[str, str, int | None, float | None]]] = {}
        for chapter, name, status, minutes, taken in self.rows:
            chapters.setdefault(chapter, []).append((name, status, minutes, taken))
        return chapters

    def timings(self) -> list[dict]:
        """The passed exercises' measured times beside their estimates: what an author compares."""
        return [{"chapter": c, "exercise": n, "estimate_min": m, "taken_min": round(t / 60, 1)}
                for c, n, _, m, t in self.rows if t is not None]

    @staticmethod
    def _summary(rows: list[tuple[str, str, int | None, float | None]]) -> str:
        done = [(m, t) for _, s, m, t in rows if s == "passed"]
        left = sum(m or 0 for _, s, m, _ in rows if s != "passed")
        timed = [(m, t) for m, t in done if t is not None and m is not None]
        took = (f" (in {_minutes(sum(t for _, t in timed))} min from first check to pass, estimated "
                f"{sum(m for m, _ in timed)})" if timed else "")
        return f"{len(done)}/{len(rows)} passed{took}" + (f", about {left} min of exercises left" if left else "")

    @staticmethod
    def _took(minutes: int | None, taken: float | None) -> str:
        if taken is None:
            return ""
        return f"took {_minutes(taken)} min" + (f", estimated {minutes}" if minutes is not None else "")

    def __str__(self) -> str:
        lines = []
        for chapter, rows in self.by_chapter().items():
            lines.append(f"{chapter}: {self._summary(rows)}")
            lines += [f"  {_MARKS[status]} {name}" + (f" ({self._took(m, t)})" if t is not None else "")
                      for name, status, m, t in rows]
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
                f"<code>{html.escape(name)}</code>"
                + (f" <small>{self._took(m, t)}</small>" if t is not None else "") + "</span>"
                for name, status, m, t in rows
            )
            parts.append(f"<div style='margin:4px 0'><b>{html.escape(chapter)}</b> "
                         f"<span style='color:#6e7781'>{self._summary(rows)}</span><div>{cells}</div></div>")
        return "<div style='font-family:sans-serif'>" + "".join(parts) + "</div>"


def progress(chapter: str | None = None) -> Progress:
    """Every exercise of ``chapter`` (a prefix such as "03"), or of the whole course, with its status:
    passed, failed or not tried, as last checked (remembered across kernel restarts), in notebook order;
    a passed one with the minutes from its first check to its first pass, beside the estimate."""
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
        entry = recorded.get(name) if isinstance(recorded.get(name), dict) else {}
        status = entry.get("status", "not tried")
        rows.append((ch, name, status if status in STATUSES else "not tried", minutes,
                     _number(entry.get("seconds_to_pass"))))
    return Progress(rows)
