"""The mutation test of the checkers (rlhf_tutorial/checks/mutants.py), on a toy exercise: a weak checker
lets a mutant survive and it is reported, a strong one kills every mutant, listed equivalents are
honoured and stale ones reported, ids stay the same when lines outside the region move, and only the
region's lines are mutated."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

from rlhf_tutorial.checks import mutants

# cpu_only: mutants run on the CPU by design (`make mutate` sets RLHF_TUTORIAL_DEVICE=cpu); the toy
# exercise here has no device, so on the simulated GPU this module would repeat `make unit` exactly.
pytestmark = pytest.mark.cpu_only

TOY = '''
def scale(x, k):
    """x times k."""
{extra}    # >>> exercise
    y = x * k
    # <<< exercise
    return y + 0
'''


def toy_target(tmp_path: Path, extra: str = "", name: str = "toy_mut") -> mutants.Target:
    path = tmp_path / f"{name}.py"
    path.write_text(TOY.format(extra=extra))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return mutants.target_for("99_toy", "scale", module.scale, module)


def verdict(cases):
    def check(name, candidate):
        try:
            ok = all(candidate(x, k) == want for x, k, want in cases)
        except Exception as exc:  # noqa: BLE001 - a toy checker: any error fails
            return False, f"raised {type(exc).__name__}"
        return ok, "passed" if ok else "wrong value"
    return check


WEAK = verdict([(2.0, 1.0, 2.0)])  # x / 1 == x * 1: the operator swap passes
STRONG = verdict([(3.0, 2.0, 6.0), (-1.5, 4.0, -6.0)])


def test_only_the_region_is_mutated_and_ids_name_the_line_in_it(tmp_path):
    found = mutants.mutants_of(toy_target(tmp_path))
    ids = {m.id for m in found}
    assert "scale:L1:binop:Mult->Div" in ids
    assert "scale:L1:stmt:remove-Assign" in ids
    assert all(m.id.startswith("scale:L1:") for m in found), ids  # never `return y + 0` (outside)
    assert len(ids) == len(found)
    assert all(m.source != found[0].target.source for m in found)


def test_ids_do_not_move_when_lines_outside_the_region_do(tmp_path):
    before = [m.id for m in mutants.mutants_of(toy_target(tmp_path))]
    after = [m.id for m in mutants.mutants_of(toy_target(tmp_path, "    z = 1\n", name="toy_mut_moved"))]
    assert before == after


def test_a_weak_checker_lets_a_mutant_survive_and_it_is_reported(tmp_path):
    report = mutants.run([toy_target(tmp_path)], {}, check=WEAK)
    survivors = {o.mutant.id for o in report.survivors}
    assert "scale:L1:binop:Mult->Div" in survivors
    assert "scale:L1:stmt:remove-Assign" not in survivors  # NameError: killed
    summary = report.summary()
    assert not summary["passed"] and "scale:L1:binop:Mult->Div" in summary["unexpected"]
    assert summary["per_chapter"]["99_toy"]["survivors"] == len(survivors)
    files = mutants.write_survivors(report, tmp_path / "out")
    assert "scale:L1:binop:Mult->Div  |  y = x * k  ->  y = x / k" in files[0].read_text()


def test_a_listed_equivalent_survivor_passes(tmp_path):
    target = toy_target(tmp_path)
    first = mutants.run([target], {}, check=WEAK)
    listed = {o.mutant.id: "x / 1 == x * 1 on the only case" for o in first.survivors}
    report = mutants.run([target], listed, check=WEAK)
    assert report.summary()["passed"] and not report.unexpected and not report.stale


def test_a_strong_checker_kills_every_mutant_and_stale_entries_are_reported(tmp_path):
    listed = {"scale:L1:binop:Mult->Div": "was equivalent under the weak checker",
              "other_exercise:L1:const:0->1": "not run here: not stale"}
    report = mutants.run([toy_target(tmp_path)], listed, check=STRONG)
    assert report.outcomes and all(o.killed for o in report.outcomes)
    assert report.stale == ["scale:L1:binop:Mult->Div"]
    assert not report.summary()["passed"]


def test_a_reference_its_checker_rejects_is_reported_not_mutated(tmp_path):
    report = mutants.run([toy_target(tmp_path)], {}, check=verdict([(1.0, 1.0, 5.0)]))
    assert not report.outcomes and report.broken and not report.summary()["passed"]


def test_a_mutant_that_hangs_is_stopped_and_counts_as_killed(tmp_path):
    def hangs_on_division(name, candidate):
        if candidate(6.0, 2.0) == 3.0:
            while True:
                pass
        return STRONG(name, candidate)

    target = toy_target(tmp_path)
    div = [m for m in mutants.mutants_of(target) if m.id == "scale:L1:binop:Mult->Div"]
    outcomes = mutants.run_mutants(div, hangs_on_division, timeout=1.0)
    assert [(o.killed, o.why) for o in outcomes] == [(True, "timeout")]


def test_the_equivalents_list_needs_a_reason_for_each(tmp_path):
    path = tmp_path / "eq.txt"
    path.write_text("# comment\n\nscale:L1:binop:Mult->Div  the only case has k = 1\n")
    assert mutants.read_equivalents(path) == {"scale:L1:binop:Mult->Div": "the only case has k = 1"}
    path.write_text("scale:L1:binop:Mult->Div | the only case has k = 1\n")  # the notes' form
    assert mutants.read_equivalents(path) == {"scale:L1:binop:Mult->Div": "the only case has k = 1"}
    path.write_text("scale:L1:binop:Mult->Div |\n")
    with pytest.raises(ValueError, match="no reason"):
        mutants.read_equivalents(path)
    path.write_text("scale:L1:binop:Mult->Div\n")
    with pytest.raises(ValueError, match="no reason"):
        mutants.read_equivalents(path)


def test_the_committed_list_parses():
    assert all(reason for reason in mutants.read_equivalents(mutants.DEFAULT_EQUIVALENTS).values())


def test_a_course_exercise_is_mutated_inside_its_markers_only():
    (target,) = mutants.course_targets(["01_ppo"], ["compute_gae"])
    lines = target.source.splitlines()
    (start, end), = target.regions
    assert lines[start - 2].strip() == "# >>> exercise" and lines[end].strip() == "# <<< exercise"
    found = mutants.mutants_of(target)
    assert found and all(start <= m.line <= end for m in found)
    assert textwrap.dedent(lines[start - 1]).startswith("num_steps")


def test_a_mutant_that_poisons_shared_state_does_not_decide_the_others_verdicts(tmp_path):
    """In a batch (one child, mutants one after the other), a mutant that breaks state the checker shares
    would fail every later mutant, and the reference: the batch is then checked again, each alone."""
    poisoned = []
    target = toy_target(tmp_path)

    def poisoning(name, candidate):
        if poisoned:
            return False, "state broken by an earlier mutant"
        if candidate is not target.obj:  # every mutant breaks the shared state for what follows it
            poisoned.append(True)
        return WEAK(name, candidate)

    found = mutants.mutants_of(target)
    assert found[0].id != "scale:L1:binop:Mult->Div"  # the survivor is checked after a poisoning mutant
    alone = mutants.run_mutants(found, poisoning, batch=1)
    together = mutants.run_mutants(found, poisoning, batch=len(found))
    assert [(o.mutant.id, o.killed) for o in together] == [(o.mutant.id, o.killed) for o in alone]
    assert "scale:L1:binop:Mult->Div" in {o.mutant.id for o in together if not o.killed}


def test_the_command_on_a_course_exercise_prints_its_verdict(tmp_path, monkeypatch, capsys):
    """End to end on the real checker of a small exercise: the listed equivalents and the survivors file."""
    monkeypatch.setenv("RLHF_TUTORIAL_DEVICE", "cpu")  # main forces it: keep the session's as it was
    listed = mutants.main(["--list", "--exercise", "layer_init"])
    assert listed["mutants"] == len(capsys.readouterr().out.strip().splitlines()) > 0
    empty = tmp_path / "none.txt"
    empty.write_text("")
    summary = mutants.main(["--exercise", "layer_init", "--jobs", "1", "--equivalents", str(empty),
                            "--survivors-dir", str(tmp_path / "out")])
    assert summary["passed"] and summary["killed"] == summary["mutants"] == listed["mutants"]
    assert (tmp_path / "out" / "01_ppo.txt").read_text() == ""
    stale = tmp_path / "stale.txt"
    stale.write_text("layer_init:L1:stmt:remove-Expr  wrongly listed\n")
    with pytest.raises(SystemExit) as failed:
        mutants.main(["--exercise", "layer_init", "--jobs", "1", "--equivalents", str(stale)])
    assert failed.value.code == 1
    out = capsys.readouterr().out
    assert "no longer survive" in out and "layer_init:L1:stmt:remove-Expr" in out
    assert json.loads(out.strip().splitlines()[-1])["stale"] == ["layer_init:L1:stmt:remove-Expr"]


def test_the_list_can_be_rewritten_from_a_run_without_its_stale_entries(tmp_path):
    listed = {"scale:L1:binop:Mult->Div": "x / 1 == x * 1 on the only case", "scale:L1:const:gone": "stale"}
    report = mutants.run([toy_target(tmp_path)], listed, check=WEAK)
    path = tmp_path / "eq.txt"
    assert mutants.write_equivalents(report, path) == 1
    assert mutants.read_equivalents(path) == {"scale:L1:binop:Mult->Div": "x / 1 == x * 1 on the only case"}
