"""One manifest of the exercises, read from the chapter sources and the checker registry.

For every ``# %% exercise pkg.module:name`` of every ``course/NN_*.py``: a checker is registered under
that name and chapter; the package reference passes it; the untouched stub (exactly as the chapter
notebook has it) fails it as "not implemented"; and where the chapter's trainer
(``rlhf_tutorial.trainers.<module>``) runs it, the trainer can run the learner's version (it is in
the trainer's ``PLUGGABLE``). Nothing here is a hand-kept list: a new exercise is covered the moment
its chapter names it.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import textwrap

import pytest

from rlhf_tutorial.checks import load_all, run_check
from rlhf_tutorial.checks.core import REGISTRY
from rlhf_tutorial.notebooks import exercise_name, load_stub, parse_source, resolve, sources


def manifest() -> list[tuple[str, str]]:
    """(chapter, "pkg.module:name") for every exercise of every chapter source."""
    rows = []
    for src in sources():
        for cell in parse_source(src.read_text()):
            if cell.kind == "exercise":
                rows.extend((src.stem, ref) for ref in cell.refs)
    return rows


MANIFEST = manifest()


def test_the_manifest_is_not_empty_and_names_are_unique():
    names = [exercise_name(ref) for _, ref in MANIFEST]
    assert len(names) > 30
    assert len(names) == len(set(names)), "two exercises share a name: check(name) could not tell them apart"


def test_every_registered_checker_belongs_to_an_exercise():
    load_all()
    names = {exercise_name(ref) for _, ref in MANIFEST}
    assert set(REGISTRY) <= names, f"checkers without an exercise in any chapter: {sorted(set(REGISTRY) - names)}"


@pytest.mark.parametrize("chapter, ref", MANIFEST, ids=[ref for _, ref in MANIFEST])
def test_reference_passes_and_untouched_stub_fails(chapter, ref):
    load_all()
    name = exercise_name(ref)
    assert name in REGISTRY, f"{ref}: no checker registered under {name!r}"
    assert REGISTRY[name].chapter == chapter, f"{name}: registered for {REGISTRY[name].chapter}, taught in {chapter}"
    result = run_check(name, resolve(ref))
    assert result.passed, result.message
    stub = run_check(name, load_stub(chapter, name))
    assert not stub.passed and "not implemented" in stub.message, stub.message


def _trainer_of(module_name: str):
    trainer_name = module_name.replace("rlhf_tutorial.", "rlhf_tutorial.trainers.", 1)
    return importlib.import_module(trainer_name) if importlib.util.find_spec(trainer_name) else None


def used_by_trainer(module, trainer) -> set[str]:
    """Top-level names of the exercise ``module`` that the trainer runs: those its source names, and,
    through the module's functions (not into classes: a class is plugged as a whole), what they call."""
    defs = {
        node.name: node
        for node in ast.parse(inspect.getsource(module)).body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef))
    }

    def names(tree: ast.AST) -> set[str]:
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                found.add(node.id)
            elif isinstance(node, ast.Attribute):
                found.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
        return found & set(defs)

    todo = list(names(ast.parse(textwrap.dedent(inspect.getsource(trainer)))))
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if isinstance(defs[name], ast.FunctionDef):
            todo.extend(names(defs[name]) - seen)
    return seen


TRAINED = [(chapter, ref) for chapter, ref in MANIFEST if _trainer_of(ref.split(":")[0]) is not None]


@pytest.mark.parametrize("chapter, ref", TRAINED, ids=[ref for _, ref in TRAINED])
def test_pluggable_where_a_trainer_runs_it(chapter, ref):
    module_name, name = ref.split(":")
    module, trainer = importlib.import_module(module_name), _trainer_of(module_name)
    if name in used_by_trainer(module, trainer):
        assert name in trainer.PLUGGABLE, f"{trainer.__name__} runs {name} but cannot run the learner's version"
        assert callable(trainer.learner_functions({name: resolve(ref)}).get(name))


def test_used_by_trainer_follows_calls():
    from rlhf_tutorial import ppo
    from rlhf_tutorial.trainers import ppo as ppo_trainer

    used = used_by_trainer(ppo, ppo_trainer)
    assert {"ppo_learning_phase", "compute_gae", "get_minibatch_indices", "layer_init"} <= used
