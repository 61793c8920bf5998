"""Every clause of every exercise's contract is exercised by its checker: the map is complete.

An exercise's contract (its CURRICULUM.md row and its docstring) is a list of clauses: "differentiable
in x", "never in place", "the last answer line wins", "raises ValueError naming k1, k2 and k3", "a
threshold of 0.0 is a value, not unset", "the option is honoured", "exact up to n = 1024"... A clause
that no case exercises lets every version that breaks only that clause pass. So the map is kept in two
places, each where it belongs, and this test holds them together:

- the chapter's checker module (``rlhf_tutorial/checks/chNN_*.py``) states the contract clause by
  clause, in words: ``CLAUSES = {exercise: {clause_id: "the clause"}}``;
- the chapter's checker tests (``tests/checks/test_chNN_*.py``) write, for every clause, at least one
  version that breaks that clause (and, as far as a version can, only that one):
  ``VIOLATIONS = {exercise: {clause_id: [wrong_version, ...]}}``.

Here: every exercise of every chapter (the manifest of ``course/``) has clauses; every clause has a
violation; every violation is rejected by the checker, as a real attempt (never called an untouched
stub) and never by a crash of the checker itself; and no violation names a clause the contract does not
state. A new clause without a violating version, or a violation the checker accepts, fails here.
"""

from __future__ import annotations

import importlib

import pytest

from rlhf_tutorial.checks import load_all, run_check
from rlhf_tutorial.checks.core import REGISTRY
from rlhf_tutorial.notebooks import exercise_name, parse_source, sources

CHECKER_BUG = "this may be a bug in the checker"
STUB_WORDS = "not implemented"


def _manifest() -> list[tuple[str, str]]:
    rows = []
    for src in sources():
        for cell in parse_source(src.read_text()):
            if cell.kind == "exercise":
                rows.extend((src.stem, exercise_name(ref)) for ref in cell.refs)
    return rows


MANIFEST = _manifest()


def _checker_module(name: str):
    load_all()
    return importlib.import_module(REGISTRY[name].fn.__module__)


def _test_module(name: str):
    """``tests.checks.test_chNN_x`` for the checker module ``rlhf_tutorial.checks.chNN_x``."""
    short = _checker_module(name).__name__.rsplit(".", 1)[1]
    return importlib.import_module(f"tests.checks.test_{short}")


def clauses(name: str) -> dict[str, str]:
    return getattr(_checker_module(name), "CLAUSES", {}).get(name, {})


def violations(name: str) -> dict[str, list]:
    return getattr(_test_module(name), "VIOLATIONS", {}).get(name, {})


def _rows() -> list[tuple[str, str, int]]:
    """(exercise, clause id, index of the violation) for every violation written in the tests."""
    rows = []
    for _, name in MANIFEST:
        try:
            found = violations(name)
        except (ImportError, KeyError):
            continue
        for clause_id, versions in found.items():
            rows.extend((name, clause_id, i) for i in range(len(versions)))
    return rows


@pytest.mark.parametrize("chapter, name", MANIFEST, ids=[name for _, name in MANIFEST])
def test_every_clause_of_the_contract_has_a_violation(chapter, name):
    stated = clauses(name)
    assert stated, (f"{chapter}: {name} states no contract clauses: add CLAUSES[{name!r}] to "
                    f"{_checker_module(name).__name__}, one entry per clause of its CURRICULUM row and docstring")
    for clause_id, text in stated.items():
        assert isinstance(text, str) and len(text.split()) >= 3, f"{name}.{clause_id}: say the clause in words"
    written = violations(name)
    unknown = sorted(set(written) - set(stated))
    assert not unknown, f"{name}: violations of clauses its contract does not state: {unknown}"
    missing = [f"{clause_id} ({stated[clause_id]})" for clause_id in stated if not written.get(clause_id)]
    assert not missing, (f"{name}: no wrong version breaks these clauses (write one into "
                         f"{_test_module(name).__name__}.VIOLATIONS): " + "; ".join(missing))


ROWS = _rows()


@pytest.mark.cpu_only
@pytest.mark.parametrize("name, clause_id, index", ROWS, ids=[f"{n}.{c}[{i}]" for n, c, i in ROWS])
def test_each_violation_is_rejected_as_a_real_attempt(name, clause_id, index):
    """cpu_only: on a GPU a check runs the CPU pass first, and a wrong version is judged there, where it
    fails, so the GPU pass never runs (run_check); device clauses are not in the map. A run on the
    simulated GPU would repeat this run exactly."""
    version = violations(name)[clause_id][index]
    result = run_check(name, version)
    assert not result.passed, f"{name}: a version breaking '{clauses(name).get(clause_id)}' passed: {result.message}"
    assert STUB_WORDS not in result.message, f"{name}.{clause_id}: a real attempt was called a stub: {result.message}"
    assert CHECKER_BUG not in result.message, f"{name}.{clause_id}: the checker crashed: {result.message}"
