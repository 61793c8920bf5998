"""Build ``chapters/`` (stubs) and ``solutions/`` (solved) notebooks from the one source in ``course/``.

A source is a Python file cut into cells by ``# %%`` headers (see docs/AUTHORING.md). An exercise cell
names reference objects in the package (``# %% exercise rlhf_tutorial.ppo:compute_gae``): the solution
notebook gets their source, the chapter notebook the same signatures and docstrings with the bodies
replaced by ``raise NotImplementedError``. After each exercise the build adds a hint cell (the first two
rungs of the checker's hint ladder; the code rung only through ``hint(name, 3)``) and a ``check(name)`` cell.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat

from rlhf_tutorial import figures

ROOT = Path(__file__).resolve().parents[1]
COURSE_DIR = ROOT / "course"
BEGIN, END = "# >>> exercise", "# <<< exercise"
_HEADER = re.compile(r"^# %%(.*)$")


@dataclass(frozen=True)
class ExerciseMeta:
    """What an exercise's heading shows: a time estimate and two ratings out of 5 (ARENA's convention).

    Written in the source after the exercise header's references:
    ``# %% exercise rlhf_tutorial.ppo:compute_gae | 20 min | difficulty 3 | importance 5``.
    """

    minutes: int
    difficulty: int  # 1 (a line or two) .. 5 (hard: most learners need the hint)
    importance: int  # 1 (a detail) .. 5 (the heart of the chapter)

    def heading(self, names: tuple[str, ...]) -> str:
        """The markdown heading cell the build puts before the exercise: each rating as five stars
        (U+2605/U+2606, text glyphs of DejaVu Sans and other default fonts, not emoji, which render as
        empty boxes where no emoji font is installed) followed by the number, e.g. "★★★☆☆ 3/5"."""
        title = ", ".join(f"`{n}`" for n in names)
        return (f"#### Exercise: {title}\n\n> **Difficulty** {stars(self.difficulty)} &nbsp; "
                f"**Importance** {stars(self.importance)} &nbsp; **Time** about {self.minutes} minutes")


#: The minutes each difficulty is estimated at, the same in every chapter (docs/AUTHORING.md, "Time and
#: ratings"): an estimate lies in its difficulty's range, and a measured median outside it says that the
#: rating (not the range) is to be revisited (``python -m rlhf_tutorial timings``).
DIFFICULTY_MINUTES: dict[int, tuple[int, int]] = {1: (5, 10), 2: (10, 15), 3: (15, 25), 4: (25, 30), 5: (30, 45)}

FULL_STAR, EMPTY_STAR = "\u2605", "\u2606"


def stars(rating: int, out_of: int = 5) -> str:
    """``3`` -> "★★★☆☆ 3/5": the rating as filled and empty stars, then as a number."""
    return FULL_STAR * rating + EMPTY_STAR * (out_of - rating) + f" {rating}/{out_of}"


@dataclass
class Cell:
    kind: str  # "markdown" | "code" | "imports" | "solution" | "stub" | "exercise" | "source"
    source: str
    refs: tuple[str, ...] = ()  # for exercises and sources: "module:name"
    meta: ExerciseMeta | None = None  # for exercises: time and ratings


_META = {
    "min": re.compile(r"^(\d+)\s*min(?:utes)?$"),
    "difficulty": re.compile(r"^difficulty\s+([1-5])$"),
    "importance": re.compile(r"^importance\s+([1-5])$"),
}


def parse_meta(parts: list[str], header: str) -> ExerciseMeta:
    """``["20 min", "difficulty 3", "importance 5"]`` (any order) -> ExerciseMeta; all three are required."""
    found: dict[str, int] = {}
    for part in (p.strip() for p in parts):
        for key, pattern in _META.items():
            match = pattern.match(part)
            if match:
                found[key] = int(match.group(1))
                break
        else:
            raise ValueError(f"course source: '# %%{header}': cannot read {part!r} "
                             "(expected 'N min', 'difficulty 1-5', 'importance 1-5')")
    missing = [k if k != "min" else "N min" for k in _META if k not in found]
    if missing:
        raise ValueError(f"course source: '# %%{header}' lacks {', '.join(missing)}: every exercise states "
                         "its time and ratings, e.g. '# %% exercise pkg.mod:name | 15 min | difficulty 2 | importance 4'")
    return ExerciseMeta(found["min"], found["difficulty"], found["importance"])


def parse_source(text: str) -> list[Cell]:
    """Cut a course source into cells."""
    cells: list[Cell] = []
    header, lines = None, []

    def flush() -> None:
        if header is None:
            if "".join(lines).strip():
                raise ValueError("course source: text before the first '# %%' header")
            return
        words = header.split()
        body = "\n".join(lines).strip("\n")
        if words[:1] == ["[markdown]"]:
            md = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in body.splitlines())
            cells.append(Cell("markdown", md.strip("\n")))
        elif not words:
            cells.append(Cell("code", body))
        elif words[0] in {"imports", "solution", "stub"}:
            cells.append(Cell(words[0], body))
        elif words[0] == "exercise" and len(words) > 1:
            refs, *meta = header.strip()[len("exercise"):].split("|")
            cells.append(Cell("exercise", body, tuple(refs.split()), parse_meta(meta, header)))
        elif words[0] == "source" and len(words) > 1:
            cells.append(Cell("source", body, tuple(words[1:])))
        else:
            raise ValueError(f"course source: unknown cell header '# %%{header}'")

    for line in text.splitlines():
        match = _HEADER.match(line)
        if match:
            flush()
            header, lines = match.group(1), []
        else:
            lines.append(line)
    flush()
    return cells


def resolve(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def exercise_name(ref: str) -> str:
    return ref.partition(":")[2]


def stub_message(name: str) -> str:
    return f'raise NotImplementedError("exercise {name}: your code here (stuck? see the hint below, or hint(\\"{name}\\"))")'


def solution_source(obj: Any) -> str:
    """The reference's source as the solution notebook shows it (exercise markers removed)."""
    src = textwrap.dedent(inspect.getsource(obj))
    return "\n".join(line for line in src.splitlines() if line.strip() not in {BEGIN, END})


def solution_code(obj: Any) -> str:
    """The code a learner writes for the exercise ``obj``, as the last rung of its hint: a ```python
    fence around the marked region (regions joined by ``...``), else the function's body after its
    docstring, else (a class) the whole class. One home: the reference is the code."""
    src = textwrap.dedent(inspect.getsource(obj))
    lines = src.splitlines()
    if any(line.strip() == BEGIN for line in lines):
        regions, current = [], None
        for line in lines:
            if line.strip() == BEGIN:
                current = []
            elif line.strip() == END:
                regions.append(textwrap.dedent("\n".join(current)))
                current = None
            elif current is not None:
                current.append(line)
        code = "\n...\n".join(regions)
    elif inspect.isclass(obj):
        code = src
    else:
        body = ast.parse(src).body[0].body
        has_doc = isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant)
        first = body[0].end_lineno if has_doc and len(body) > 1 else body[0].lineno - 1
        code = textwrap.dedent("\n".join(lines[first:]))
    return f"```python\n{code.strip()}\n```"


def top_level_functions(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The functions of a parsed source and the methods of its classes (one level: what a learner's
    exercise body is, where no exercise markers say otherwise), in source order."""
    functions: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.append(node)
        elif isinstance(node, ast.ClassDef):
            functions += [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return functions


def stub_source(obj: Any, name: str) -> str:
    """The reference's source with the learner's part replaced by ``raise NotImplementedError``.

    With exercise markers, only the marked region is replaced; otherwise every function body (every
    method body, for a class) after its docstring.
    """
    lines = textwrap.dedent(inspect.getsource(obj)).splitlines()
    raise_line = stub_message(name)
    if any(line.strip() == BEGIN for line in lines):
        out, skipping = [], False
        for line in lines:
            if line.strip() == BEGIN:
                indent = line[: len(line) - len(line.lstrip())]
                out.append(indent + raise_line)
                skipping = True
            elif line.strip() == END:
                skipping = False
            elif not skipping:
                out.append(line)
        return "\n".join(out)

    functions = top_level_functions(ast.parse("\n".join(lines)))
    if not functions:
        raise ValueError(f"{name}: nothing to stub (no function or method found)")
    # Replace bodies from the last function up, so earlier line numbers stay valid.
    for fn in sorted(functions, key=lambda f: f.lineno, reverse=True):
        body = fn.body
        has_doc = isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant)
        has_doc = has_doc and isinstance(body[0].value.value, str)
        first = body[0].end_lineno if has_doc else fn.body[0].lineno - 1  # last kept line (1-based)
        if has_doc and len(body) == 1:
            continue  # docstring only: nothing to write
        indent = " " * body[0].col_offset
        lines[first : fn.end_lineno] = [indent + raise_line]
    return "\n".join(lines)


def hint_markdown(name: str) -> str:
    """The collapsed hint cell after an exercise: the first two rungs of its ladder as nested
    ``<details>`` (a nudge; inside it the approach), so each opens only after the one before. The
    third rung, the code, is not in the notebook (a learner or a program reading the .ipynb would find
    the solution there): the cell says to run ``hint("name", 3)``, which reads it from the installed
    package (``notebooks.solution_code`` of the reference) when asked."""
    from rlhf_tutorial.checks.core import REGISTRY, RUNGS, load_all

    load_all()
    if name not in REGISTRY:
        raise ValueError(f"exercise {name!r} has no registered checker: every exercise needs one")
    rungs = REGISTRY[name].hint
    if len(rungs) == 1:  # a chapter not yet on the ladder
        return f"<details><summary><b>Hint</b> for <code>{name}</code></summary>\n\n{rungs[0]}\n\n</details>"
    shown = rungs[: RUNGS - 1]
    labels = (f"<b>Hint 1</b> for <code>{name}</code>: a nudge", "<b>Hint 2</b>: the approach")
    opened = "\n\n".join(f"<details><summary>{label}</summary>\n\n{text}" for label, text in zip(labels, shown))
    code = code_rung_pointer(name)
    return opened + f"\n\n{code}\n\n" + "\n".join("</details>" for _ in shown)


def code_rung_pointer(name: str) -> str:
    """What the hint cell says in place of the code rung: how to ask for it."""
    return (f"**Hint 3, the code:** run `hint(\"{name}\", 3)` in a cell. It is not written in this notebook: "
            "try the two rungs above first.")


def how_to_work(stem: str, variant: str) -> str:
    """The note under each notebook's title: how to work through it (and why Run All stops)."""
    if variant == "solution":
        return (f"> **This is the solved notebook.** The exercises are in `chapters/{stem}.ipynb`; open this one "
                "to compare with your code, or to see every figure of the chapter. Run All runs it top to bottom.")
    return (
        "> **How to work through this chapter.** Run the cells from the top, one at a time (Shift+Enter). "
        "At each exercise, replace the `raise NotImplementedError(...)` line with your code, run the cell, "
        "then run the `check(...)` cell below it. Stuck? The hints are a ladder: `hint(\"name\")` gives a nudge, "
        "`hint(\"name\", 2)` the approach, `hint(\"name\", 3)` the code (the collapsed **Hint** cell holds the first "
        f"two rungs, one inside the other); `solutions/{stem}.ipynb` has the solved chapter (in the file browser: one "
        "folder up, then `solutions/`). `progress()` lists what you have passed, across kernel restarts.\n>\n"
        "> **Run All stops at the first exercise you have not written yet**, with a `NotImplementedError` "
        "that names it: that is expected, and it marks where to continue."
    )


def build(cells: list[Cell], variant: str, stem: str = "") -> nbformat.NotebookNode:
    """The notebook for ``variant`` ("chapter" or "solution")."""
    nb = nbformat.v4.new_notebook()
    recorded = figures.recorded()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    out = []
    for cell in cells:
        if cell.kind == "markdown":  # quoted run figures come from figures.json
            out.append(nbformat.v4.new_markdown_cell(figures.substitute(cell.source, recorded)))
            if len(out) == 1 and stem:  # under the title
                out.append(nbformat.v4.new_markdown_cell(how_to_work(stem, variant)))
        elif cell.kind in {"code", "imports"} or cell.kind == variant.replace("chapter", "stub"):
            out.append(nbformat.v4.new_code_cell(cell.source))
        elif cell.kind == "source":  # a reference helper shown whole, in both notebooks
            parts = [solution_source(resolve(ref)) for ref in cell.refs]
            out.append(nbformat.v4.new_code_cell("\n\n\n".join(parts + ([cell.source] if cell.source.strip() else []))))
        elif cell.kind == "exercise":
            out.append(nbformat.v4.new_markdown_cell(cell.meta.heading(tuple(map(exercise_name, cell.refs)))))
            parts = []
            for ref in cell.refs:
                obj, name = resolve(ref), exercise_name(ref)
                parts.append(solution_source(obj) if variant == "solution" else stub_source(obj, name))
            if cell.source.strip():
                parts.append(cell.source)
            out.append(nbformat.v4.new_code_cell("\n\n\n".join(parts)))
            for ref in cell.refs:
                out.append(nbformat.v4.new_markdown_cell(hint_markdown(exercise_name(ref))))
                out.append(nbformat.v4.new_code_cell(f"check({exercise_name(ref)})"))
    for i, c in enumerate(out):
        c.id = f"cell-{i:03d}"
    nb.cells = out
    return nb


def render(cells: list[Cell], variant: str, stem: str = "") -> str:
    return nbformat.writes(build(cells, variant, stem)) + "\n"


def sources() -> list[Path]:
    return sorted(COURSE_DIR.glob("[0-9][0-9]_*.py"))


def expected_files(root: Path = ROOT) -> dict[Path, str]:
    """Every generated notebook path and the text the build writes there."""
    files = {}
    for src in sources():
        cells = parse_source(src.read_text())
        files[root / "chapters" / f"{src.stem}.ipynb"] = render(cells, "chapter", src.stem)
        files[root / "solutions" / f"{src.stem}.ipynb"] = render(cells, "solution", src.stem)
    return files


def generated_files(root: Path = ROOT) -> dict[Path, str]:
    """What ``build-notebooks`` writes: every notebook, and the README with its quoted run figures
    rewritten from figures.json."""
    files = expected_files(root)
    readme = root / "README.md"
    if readme.exists():
        files[readme] = figures.sync_readme(readme.read_text())
    return files


@dataclass(frozen=True)
class Exercise:
    chapter: str  # the source's stem, e.g. "01_ppo"
    name: str
    meta: ExerciseMeta


def exercises() -> list[Exercise]:
    """Every exercise of the course in notebook order (chapters by number, then by position).

    Empty when the course sources are not there (an installed package without the repository)."""
    return [Exercise(src.stem, exercise_name(ref), cell.meta)
            for src in sources() for cell in parse_source(src.read_text()) if cell.kind == "exercise"
            for ref in cell.refs]


def load_stub(chapter: str, name: str) -> Any:
    """The stub of exercise ``name`` exactly as a learner gets it in chapter ``chapter``.

    Runs what the notebook would have run before it, in order: the imports cells and every exercise
    stub up to this one (a later signature may name an earlier exercise's class). Tests use it to check
    that the untouched exercise fails its checker.
    """
    cells = parse_source((COURSE_DIR / f"{chapter}.py").read_text())
    namespace: dict[str, Any] = {"__name__": f"stub_{chapter}"}
    for cell in cells:
        if cell.kind == "imports":
            source, label = cell.source, "imports"
        elif cell.kind == "exercise":
            source = "\n\n\n".join(stub_source(resolve(ref), exercise_name(ref)) for ref in cell.refs)
            label = "stub"
        elif cell.kind == "source":
            source, label = "\n\n\n".join(solution_source(resolve(ref)) for ref in cell.refs), "source"
        else:
            continue
        # dont_inherit: this module's `from __future__ import annotations` must not leak into the stub.
        exec(compile(source, f"<{chapter} {label}>", "exec", dont_inherit=True), namespace)
        if name in map(exercise_name, cell.refs):
            return namespace[name]
    raise KeyError(f"no exercise {name!r} in course/{chapter}.py")


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="python -m rlhf_tutorial build-notebooks", description=__doc__)
    parser.add_argument("--check", action="store_true", help="write nothing; fail if a notebook is stale")
    args = parser.parse_args(argv)
    written, stale = [], []
    for path, text in generated_files().items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        stale.append(str(path.relative_to(ROOT)))
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(str(path.relative_to(ROOT)))
    if args.check and stale:
        raise SystemExit(f"stale notebooks (run `python -m rlhf_tutorial build-notebooks`): {stale}")
    return {"written": written, "stale": stale, "sources": [s.name for s in sources()]}
