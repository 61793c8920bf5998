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

**From the heading.** A learner who works down a chapter reads an exercise's heading right after the
exercise before it passed. So ``progress()`` also gives, per passed exercise, the seconds from the
previous exercise's pass (in notebook order, same chapter) to its own pass, when the learner moved
straight on: the previous pass came before this exercise's first check, by at most ``BREAK_SECONDS``
(longer: a break, and only the first-check clock is known). That span holds the reading, the writing and
the debugging: the time an estimate means. The first exercise of a chapter has only the first-check clock.
``python -m rlhf_tutorial timings FILE ...`` gathers several learners' files into medians per exercise.
"""

from __future__ import annotations

import html
import json
import os
import sys
import time
from pathlib import Path

PROGRESS_ENV_VAR = "RLHF_TUTORIAL_PROGRESS_FILE"
STATUSES = ("passed", "failed", "not tried")
_MARKS = {"passed": "[x]", "failed": "[!]", "not tried": "[ ]"}
#: Longer than this between the previous exercise's pass and this one's first check is a break: the
#: span from the heading is then not known (see the module docstring).
BREAK_SECONDS = 3600.0
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
    pass, seconds from the heading to the first pass) in notebook order; shows as a table per chapter.
    The last is None where it is not known (module docstring, "From the heading")."""

    def __init__(self, rows: list[tuple]):
        self.rows = [(*row, None)[:6] for row in rows]

    def by_chapter(self) -> dict[str, list[tuple]]:
        chapters: dict[str, list[tuple]] = {}
        for chapter, name, status, minutes, taken, span in self.rows:
            chapters.setdefault(chapter, []).append((name, status, minutes, taken, span))
        return chapters

    def timings(self) -> list[dict]:
        """The passed exercises' measured times beside their estimates: what an author compares.
        ``taken_min``: from the first check; ``from_heading_min``: from the previous exercise's pass."""
        return [{"chapter": c, "exercise": n, "estimate_min": m, "taken_min": round(t / 60, 1),
                 "from_heading_min": None if h is None else round(h / 60, 1)}
                for c, n, _, m, t, h in self.rows if t is not None]

    @staticmethod
    def _best(taken: float | None, span: float | None) -> float | None:
        """The time shown: from the heading where known, else from the first check."""
        return span if span is not None else taken

    @classmethod
    def _summary(cls, rows: list[tuple]) -> str:
        done = [(m, cls._best(t, h)) for _, s, m, t, h in rows if s == "passed"]
        left = sum(m or 0 for _, s, m, _, _ in rows if s != "passed")
        timed = [(m, t) for m, t in done if t is not None and m is not None]
        took = (f" (in {_minutes(sum(t for _, t in timed))} min, estimated "
                f"{sum(m for m, _ in timed)})" if timed else "")
        return f"{len(done)}/{len(rows)} passed{took}" + (f", about {left} min of exercises left" if left else "")

    @classmethod
    def _took(cls, minutes: int | None, taken: float | None, span: float | None = None) -> str:
        shown = cls._best(taken, span)
        if shown is None:
            return ""
        since = " from the heading" if span is not None else ""
        return f"took {_minutes(shown)} min{since}" + (f", estimated {minutes}" if minutes is not None else "")

    def __str__(self) -> str:
        lines = []
        for chapter, rows in self.by_chapter().items():
            lines.append(f"{chapter}: {self._summary(rows)}")
            lines += [f"  {_MARKS[status]} {name}" + (f" ({self._took(m, t, h)})" if t is not None else "")
                      for name, status, m, t, h in rows]
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
                + (f" <small>{self._took(m, t, h)}</small>" if t is not None else "") + "</span>"
                for name, status, m, t, h in rows
            )
            parts.append(f"<div style='margin:4px 0'><b>{html.escape(chapter)}</b> "
                         f"<span style='color:#6e7781'>{self._summary(rows)}</span><div>{cells}</div></div>")
        return "<div style='font-family:sans-serif'>" + "".join(parts) + "</div>"


def _pass_time(entry: dict) -> float | None:
    """When the exercise first passed (seconds since the epoch), or None."""
    first, taken = _number(entry.get("first_check")), _number(entry.get("seconds_to_pass"))
    return None if first is None or taken is None else first + taken


def from_heading(entry: dict, previous: dict | None) -> float | None:
    """Seconds from the heading to the first pass: from ``previous``'s pass (the exercise before, same
    chapter) when the learner moved straight on (that pass came before ``entry``'s first check, by at most
    ``BREAK_SECONDS``); else None."""
    done, before = _pass_time(entry), _pass_time(previous or {})
    first = _number(entry.get("first_check"))
    if done is None or before is None or first is None or not 0.0 <= first - before <= BREAK_SECONDS:
        return None
    return done - before


def rows_of(recorded: dict, chapter: str | None = None) -> list[tuple]:
    """``Progress`` rows for the record ``recorded`` (a progress file's contents)."""
    from rlhf_tutorial.checks.core import REGISTRY, load_all
    from rlhf_tutorial.notebooks import exercises

    load_all()
    ordered = [(e.chapter, e.name, e.meta.minutes) for e in exercises()]
    known = {name for _, name, _ in ordered}
    # Exercises with a checker but not in a source here (an installed package without course/).
    ordered += sorted((c.chapter, n, None) for n, c in REGISTRY.items() if n not in known)
    rows, previous = [], {}
    for ch, name, minutes in ordered:
        entry = recorded.get(name) if isinstance(recorded.get(name), dict) else {}
        before = previous.get(ch)
        previous[ch] = entry
        if chapter is not None and not ch.startswith(chapter):
            continue
        status = entry.get("status", "not tried")
        rows.append((ch, name, status if status in STATUSES else "not tried", minutes,
                     _number(entry.get("seconds_to_pass")), from_heading(entry, before)))
    return rows


def progress(chapter: str | None = None) -> Progress:
    """Every exercise of ``chapter`` (a prefix such as "03"), or of the whole course, with its status:
    passed, failed or not tried, as last checked (remembered across kernel restarts), in notebook order;
    a passed one with the minutes it took (from its heading where known, else from its first check)
    beside the estimate."""
    return Progress(rows_of(load(), chapter))


def gather(records: list[dict], chapter: str | None = None) -> list[dict]:
    """Per exercise over several learners' records (progress files' contents): how many passed it, the median
    minutes it took (from the heading where known, else from the first check, a lower bound: ``from_heading``
    counts the first kind), beside the estimate and its difficulty's range (``notebooks.DIFFICULTY_MINUTES``);
    ``outside_range`` when the median falls outside that range: the rating is the thing to revisit."""
    import statistics

    from rlhf_tutorial.notebooks import DIFFICULTY_MINUTES, exercises

    difficulty = {e.name: e.meta.difficulty for e in exercises()}
    times: dict[tuple[str, str, int | None], list[tuple[float, bool]]] = {}
    for recorded in records:
        for ch, name, _, minutes, taken, span in rows_of(recorded, chapter):
            key = (ch, name, minutes)
            times.setdefault(key, [])
            if taken is not None:
                times[key].append((span if span is not None else taken, span is not None))
    out = []
    for (ch, name, minutes), seen in times.items():
        low, high = DIFFICULTY_MINUTES.get(difficulty.get(name, 0), (None, None))
        median = round(statistics.median(t for t, _ in seen) / 60, 1) if seen else None
        out.append({"chapter": ch, "exercise": name, "estimate_min": minutes, "difficulty": difficulty.get(name),
                    "range_min": None if low is None else [low, high], "learners": len(seen),
                    "from_heading": sum(h for _, h in seen), "median_min": median,
                    "outside_range": median is not None and low is not None and not low <= median <= high})
    return out


def timings_main(argv: list[str] | None = None) -> dict:
    """``python -m rlhf_tutorial timings [FILE ...] [--chapter NN]``: the measured minutes per exercise over
    the given progress files (default: this learner's own), beside the estimates; JSON on the last line."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m rlhf_tutorial timings", description=timings_main.__doc__)
    p.add_argument("files", nargs="*", type=Path, help="progress files (default: yours, progress_file())")
    p.add_argument("--chapter", default=None, help="a chapter prefix such as 06")
    ns = p.parse_args(argv)
    files = ns.files or [progress_file()]
    records, unreadable = [], {}
    for path in files:
        if path is None:
            unreadable["(progress recording is off)"] = f"{PROGRESS_ENV_VAR} is off: nothing is recorded"
            continue
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            unreadable[str(path)] = f"{type(err).__name__}: {err}"
            continue
        if not isinstance(data, dict):
            unreadable[str(path)] = "not a progress record (a JSON object of exercises)"
            continue
        records.append(data)
    rows = gather(records, ns.chapter)
    for row in rows:
        if row["learners"]:
            flag = "  <- outside its difficulty's range" if row["outside_range"] else ""
            print(f"{row['chapter']} {row['exercise']}: median {row['median_min']} min over {row['learners']} "
                  f"(from the heading: {row['from_heading']}), estimated {row['estimate_min']}{flag}", file=sys.stderr)
    summary = {"files": [str(f) for f in files], "learners": len(records), "unreadable": unreadable,
               "exercises": [r for r in rows if r["learners"]],
               "outside_range": [r["exercise"] for r in rows if r["outside_range"]]}
    return summary
