"""The checking framework: verdicts for every way a candidate can go wrong, never an exception."""

import html

import pytest
import torch

from rlhf_tutorial import tour
from rlhf_tutorial.checks import check, hint, progress, run_check
from rlhf_tutorial.checks.core import RESULTS, CheckResult


def test_reference_passes_and_result_renders():
    result = run_check("next_token_probs", tour.next_token_probs)
    assert result.passed, result.message
    assert "PASSED" in str(result)
    assert "passed" in result._repr_html_()


def test_unknown_exercise_is_a_failure_listing_the_known_ones():
    result = run_check("no_such_exercise", tour.next_token_probs)
    assert not result.passed
    assert "next_token_probs" in result.message


@pytest.mark.parametrize(
    "candidate, fragment",
    [
        (42, "expected a function"),
        (lambda model, tokens: None, "forget a `return`"),
        (lambda model, tokens: [0.0], "should be a torch.Tensor"),
        (lambda model, tokens: torch.zeros(3, device=tokens.device), "has shape"),
        (lambda model, tokens: torch.full((tokens.shape[0], model.cfg.d_vocab), float("nan"), device=tokens.device),
         "NaN"),
        (lambda model, tokens: model(tokens)[:, -1].softmax(-1).double(), "dtype"),
        (lambda model, tokens: {}["missing"], "KeyError"),
    ],
)
def test_bad_candidates_fail_with_a_message_and_never_raise(candidate, fragment):
    result = run_check("next_token_probs", candidate)
    assert not result.passed
    assert fragment in result.message
    assert "Traceback" not in result.message


def test_not_implemented_says_so():
    def stub(model, tokens):
        raise NotImplementedError("exercise next_token_probs: your code here (stuck? see the hint below)")

    result = run_check("next_token_probs", stub)
    assert not result.passed and "not implemented yet" in result.message


def test_a_mode_the_learner_left_out_is_not_called_an_untouched_stub():
    """A real implementation that raises for a case it does not handle yet (``scale="batch"``) is told
    that the contract covers the case, not to replace the stub's raise line."""
    def lacks_batch(rewards, scale="group", eps=1e-4):
        centred = rewards - rewards.mean(-1, keepdim=True)
        if scale == "group":
            return centred / (rewards.std(-1, keepdim=True) + eps)
        if scale == "none":
            return centred
        raise NotImplementedError(f"scale={scale!r} is not supported")

    result = run_check("group_relative_advantages", lacks_batch)
    assert not result.passed
    assert "not implemented yet" not in result.message and "raise NotImplementedError(...)` line" not in result.message
    assert "scale='batch' is not supported" in result.message and "the contract covers this case" in result.message


def test_in_place_mutation_of_an_input_is_caught():
    def mutating(model, tokens):
        tokens[:, 0] = 0
        return model(tokens)[:, -1].softmax(-1)

    result = run_check("next_token_probs", mutating)
    assert not result.passed and "in place" in result.message and "tokens" in result.message


def test_the_learner_line_is_named_when_their_code_raises():
    def broken(model, tokens):
        logits = model(tokens)
        return logits[:, -1].softmax(dim=5)

    result = run_check("next_token_probs", broken)
    assert not result.passed
    assert "IndexError" in result.message and "softmax(dim=5)" in result.message


def test_check_prints_in_a_terminal_and_records_progress(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("RLHF_TUTORIAL_STRICT", raising=False)
    monkeypatch.setenv("RLHF_TUTORIAL_PROGRESS_FILE", str(tmp_path / "progress.json"))
    assert "[ ] final_normalized_residual" in str(progress("00"))
    check(tour.final_normalized_residual)
    assert "[PASSED] final_normalized_residual" in capsys.readouterr().out
    check(lambda m, t: m(t), name="final_normalized_residual")
    out = capsys.readouterr().out
    assert "[FAILED]" in out and 'hint("final_normalized_residual")' in out
    assert "[!] final_normalized_residual" in str(progress("00"))


def test_a_failed_verdict_says_how_to_ask_for_the_hint_and_does_not_show_it(capsys, monkeypatch):
    from rlhf_tutorial.checks.core import REGISTRY
    from rlhf_tutorial.notebooks import load_stub

    monkeypatch.delenv("RLHF_TUTORIAL_STRICT", raising=False)
    stub = load_stub("01_ppo", "compute_gae")
    result = run_check("compute_gae", stub)
    general = REGISTRY["compute_gae"].hint[0]  # the first rung: a nudge
    assert not result.passed and "not implemented yet" in result.message
    for form in (str(result), result._repr_html_()):
        assert general not in form and general[:40] not in form
        assert "hint(" in form and "compute_gae" in form
    hint("compute_gae")  # asked: now it is shown, as a hint box's text form
    out = capsys.readouterr().out
    assert out.startswith(("[HINT] compute_gae", "[HINT 1/3] compute_gae")) and general in out and not out.startswith("'")


def test_hint_renders_as_html_like_the_verdicts():
    from rlhf_tutorial.checks.core import Hint

    box = Hint("whiten", "Subtract the mean <first>.", last_failure="You divided by the variance.")._repr_html_()
    assert box.startswith("<div style='border-left:4px solid")
    assert "Hint for whiten" in box and "&lt;first&gt;" in box and "You divided by the variance." in box


def test_progress_survives_a_new_kernel_lists_in_notebook_order_and_resets(monkeypatch, tmp_path):
    import json

    from rlhf_tutorial.checks import learner_progress as progress_module
    from rlhf_tutorial.notebooks import exercises

    monkeypatch.delenv("RLHF_TUTORIAL_STRICT", raising=False)
    monkeypatch.setenv("RLHF_TUTORIAL_PROGRESS_FILE", str(tmp_path / "p.json"))
    check(tour.next_token_probs)
    recorded = json.loads((tmp_path / "p.json").read_text())
    assert recorded["next_token_probs"]["status"] == "passed"
    RESULTS.clear()  # what a kernel restart forgets; the file remembers
    rows = progress_module.progress().rows
    assert ("00_setup_and_tour", "next_token_probs", "passed") == rows[0][:3]
    in_notebook_order = [(e.chapter, e.name) for e in exercises()]
    assert [r[:2] for r in rows][: len(in_notebook_order)] == in_notebook_order
    assert [r[1] for r in progress_module.progress("01").rows][:3] == ["layer_init", "compute_gae",
                                                                       "calc_clipped_surrogate_objective"]
    overview = str(progress_module.progress())
    assert "00_setup_and_tour: 1/2 passed" in overview and "03_rlhf_ppo: 0/" in overview
    progress_module.reset_progress("01")
    assert progress_module.progress("00").rows[0][2] == "passed"
    progress_module.reset_progress()
    assert progress_module.progress("00").rows[0][2] == "not tried"


def test_progress_off_records_nothing(monkeypatch, tmp_path):
    from rlhf_tutorial.checks.learner_progress import progress_file, record

    monkeypatch.setenv("RLHF_TUTORIAL_PROGRESS_FILE", "off")
    assert progress_file() is None
    record("whiten", "02_rewards", True)  # no error, no file
    assert list(tmp_path.iterdir()) == []


def test_strict_mode_raises_on_failure_only(monkeypatch):
    monkeypatch.setenv("RLHF_TUTORIAL_STRICT", "1")
    check(tour.next_token_probs)  # passes: no exception
    with pytest.raises(AssertionError, match="next_token_probs"):
        check(lambda m, t: m(t)[:, -1], name="next_token_probs")


def test_checking_does_not_disturb_the_learners_random_state():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    run_check("next_token_probs", tour.next_token_probs)
    assert torch.equal(torch.rand(3), expected)


def test_check_result_text_has_no_hint_when_passed():
    assert "Hint" not in str(CheckResult("x", True, "ok", hint="h"))


def test_a_mistake_that_equals_the_reference_on_the_case_is_never_named():
    from rlhf_tutorial.checks.core import Case, CheckFailure, Mistake, compare_to_reference

    def reference(x):
        return x.abs()

    cases = [Case("non-negative inputs", (torch.tensor([0.0, 1.0, 2.0]),))]
    same_here = Mistake("You forgot abs.", lambda x: x.clone())  # equals the reference on this case
    with pytest.raises(CheckFailure) as wrong:  # wrong values, and the mistake explains nothing here
        compare_to_reference(lambda x: x + 1, reference, cases, mistakes=[same_here])
    assert wrong.value.hint is None
    with pytest.raises(CheckFailure) as dtype:  # right values in float64: the dtype verdict, no mistake
        compare_to_reference(lambda x: x.abs().double(), reference, cases, mistakes=[same_here])
    assert "values are right" in dtype.value.message and "float64: return float32" in dtype.value.message
    assert "abs" not in (dtype.value.hint or "")
    named = Mistake("Off by one: you added 1.", lambda x: x + 1)
    with pytest.raises(CheckFailure) as matched:  # a real match: the nudge in the message, the hint apart
        compare_to_reference(lambda x: x + 1, reference, cases, mistakes=[same_here, named])
    assert matched.value.hint == "Off by one: you added 1." and "Off by one." in matched.value.message


def test_a_targeted_hint_puts_its_nudge_in_the_verdict_and_keeps_the_full_hint_apart():
    def first_position(model, tokens):
        return model(tokens)[:, 0].softmax(-1)

    result = run_check("next_token_probs", first_position)
    assert not result.passed
    assert "You read the first position." in result.message  # the nudge: what is wrong
    assert "LAST position" in result.hint and "LAST position" not in result.message  # the fix: only when asked


MIXED = ("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! "
         "(when checking argument for argument mat1 in method wrapper_CUDA_addmm)")


@pytest.fixture
def scratch_checker():
    """A throwaway exercise ``_scratch`` whose checker calls the candidate on a tensor (on the check's
    device), then raises ``checker_raises`` itself (None: it passes); removed afterwards."""
    from rlhf_tutorial.checks import core

    state = {"checker_raises": None}

    @core.checker("_scratch", chapter="test", hint="a hint")
    def check_scratch(candidate):
        core.call(candidate, core.to_device(torch.ones(2)))  # on the running pass's device, as checkers build
        if state["checker_raises"] is not None:
            raise state["checker_raises"]

    yield state
    core.REGISTRY.pop("_scratch", None)


def test_a_device_mix_in_the_learners_code_is_named_as_theirs(scratch_checker):
    def learner(x):
        raise RuntimeError(MIXED)

    result = run_check("_scratch", learner)
    assert not result.passed
    assert result.message.startswith("your code mixed devices") and "checker" not in result.message


def test_a_device_mix_inside_the_checker_is_never_reported_as_the_learners(scratch_checker):
    scratch_checker["checker_raises"] = RuntimeError(MIXED)
    result = run_check("_scratch", lambda x: x * 2)
    assert not result.passed
    assert "inside the checker, not in your code" in result.message and "bug in the checker" in result.message


def test_an_output_on_another_device_than_the_inputs_is_named():
    from rlhf_tutorial.checks.core import device_problem

    meta = torch.device("meta")  # any second device: the message names both
    assert device_problem(torch.ones(2), torch.device("cpu")) is None
    text = device_problem(torch.ones(2), meta)
    assert "is on cpu, the inputs on meta" in text
    head = torch.nn.Sequential(torch.nn.Linear(2, 1))
    model = torch.nn.Module()
    model.value_head = head
    assert "your value head is on cpu, the model on meta" in device_problem(model, meta)


def test_a_librarys_not_implemented_error_is_not_an_untouched_stub(scratch_checker):
    def stub(x):
        raise NotImplementedError("exercise _scratch: your code here")

    assert "not implemented yet" in run_check("_scratch", stub).message
    library = run_check("_scratch", lambda x: torch.ones(2).to_sparse().view(-1, 1))
    assert "not implemented yet" not in library.message and "your code raised" in library.message


def _passes() -> tuple[str, ...]:
    """The devices a check runs on here: the CPU first when the course's device is another one."""
    from rlhf_tutorial.devices import course_device

    device = str(course_device())
    return ("cpu",) if device == "cpu" else ("cpu", device)


def test_a_check_runs_on_the_cpu_first_and_then_on_the_courses_device(scratch_checker):
    """On a GPU (or the simulated one) a right candidate runs on the CPU, then on the device; on a
    CPU-only machine once. What the candidate saw is what ``devices`` says."""
    from rlhf_tutorial.checks.core import is_cpu_pass

    seen, cpu_first = [], []

    def learner(x):
        seen.append(str(x.device))
        cpu_first.append(is_cpu_pass())  # what a checker may consult to skip a repeated training run
        return x * 2

    result = run_check("_scratch", learner)
    # a tensor's device names its index ("cuda:0") where the course's device may not ("cuda")
    indexed = tuple(d if d.startswith("cpu") or ":" in d else f"{d}:{torch.cuda.current_device()}" for d in _passes())
    assert result.passed and result.devices == _passes() and tuple(seen) == indexed
    assert cpu_first == ([True, False] if len(_passes()) == 2 else [False])
    assert not is_cpu_pass()  # outside a check


def test_a_mistake_found_on_the_cpu_never_reaches_the_device(scratch_checker):
    """An out-of-range index (a device-side assert on CUDA, which loses the kernel's CUDA context) is
    reported from the CPU pass, with the usual message and the learner's line; the device never runs it."""
    seen = []

    def learner(x):
        seen.append(str(x.device))
        return x[torch.tensor([5])]  # x has 2 elements

    result = run_check("_scratch", learner)
    assert not result.passed and result.devices == ("cpu",) and seen == ["cpu"]
    assert "IndexError" in result.message and "x[torch.tensor([5])]" in result.message


def test_a_device_mix_found_on_the_cpu_is_judged_on_the_device(scratch_checker):
    """A failure about devices on the CPU pass (a candidate that builds on a fixed device) is not a
    verdict: the device pass judges it, and names the mix as the learner's."""
    def learner(x):
        raise RuntimeError(MIXED)

    result = run_check("_scratch", learner)
    assert result.devices == _passes() and result.message.startswith("your code mixed devices")


@pytest.mark.parametrize("where", ["learner", "checker", "earlier cell"])
def test_a_cuda_error_says_the_context_is_lost_and_the_kernel_must_restart(scratch_checker, where, monkeypatch):
    """Raised by the learner's code, by the checker's next GPU operation, or already lost before the check
    (an earlier cell: then seeding the check's random streams raises it)."""
    error = RuntimeError("CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously "
                         "reported at some other API call")

    def lost_context(seed):
        raise error

    if where == "earlier cell":
        monkeypatch.setattr(torch, "manual_seed", lost_context)

    def learner(x):
        if where == "learner":
            raise error
        return x

    if where == "checker":  # the next GPU operation after the learner's call raises it
        scratch_checker["checker_raises"] = error
    result = run_check("_scratch", learner)
    assert not result.passed and "bug in the checker" not in result.message
    assert "CUDA context of this kernel is lost" in result.message and "Restart the kernel" in result.message
    assert "index out of range" in result.message  # why, and the likely cause


LADDER = ("Nudge: which quantity, `torch.sort`.", "Approach: sort, then take the middle one.",
          "```python\nreturn torch.sort(x).values[len(x) // 2]\n```")


@pytest.fixture
def ladder_exercise(monkeypatch):
    """A registered exercise with a three-rung hint, removed again after the test."""
    from rlhf_tutorial.checks import core

    def reference(x):
        return torch.sort(x).values[len(x) // 2]

    @core.checker("toy_median", chapter="00_setup_and_tour", hint=LADDER)
    def check_toy_median(candidate):
        return core.compare_to_reference(candidate, reference, [core.Case("three values", (torch.tensor([4., 1., 2.]),))],
                                         mistakes=[core.Mistake(fn=lambda x: x.mean(), hint="You took the mean: the median "
                                                                "is the middle value. Use `torch.sort`.")])

    monkeypatch.delenv("RLHF_TUTORIAL_STRICT", raising=False)
    yield "toy_median"
    for table in (core.REGISTRY, core.HINT_SHOWN, core.LAST_FAILURE_HINT, core.RESULTS):
        table.pop("toy_median", None)


def test_what_the_learners_code_prints_shows_once_on_either_device(ladder_exercise, capsys):
    """On a GPU (here, under RLHF_TUTORIAL_DEVICE=simgpu, the simulated one) a check runs the candidate on
    the CPU, then on the GPU: a print inside it must show once, not twice. A candidate that passes shows
    the GPU pass's print; one that fails on the CPU pass shows what it printed there (the failing pass);
    one that fails only on the GPU (its result left on the CPU) shows the GPU pass's. On the CPU there is
    one pass and one print."""
    from rlhf_tutorial.devices import course_device

    gpu = course_device().type != "cpu"

    def right(x):
        print(f"right median on {x.device.type}")
        return torch.sort(x).values[len(x) // 2]

    def mean(x):
        print(f"mean on {x.device.type}")
        return x.mean()

    def left_on_cpu(x):
        print(f"left on cpu, given {x.device.type}")
        return torch.sort(x.cpu()).values[len(x) // 2]

    where = course_device().type
    for fn, passed, printed, devices in [
        (right, True, f"right median on {where}", 2 if gpu else 1),
        (mean, False, "mean on cpu", 1),
        (left_on_cpu, not gpu, f"left on cpu, given {where}", 2 if gpu else 1),
    ]:
        result = run_check(ladder_exercise, fn)
        out = capsys.readouterr().out
        assert result.passed == passed and len(result.devices) == devices, (fn.__name__, result)
        assert out.splitlines() == [printed], (fn.__name__, out)
    assert "You took the mean" in run_check(ladder_exercise, mean).message  # the verdict is unchanged


def test_a_hint_is_three_rungs_shown_one_at_a_time_each_pointing_to_the_next(ladder_exercise, capsys):
    for rung in (1, 2, 3):
        hint(ladder_exercise, rung)
        out = capsys.readouterr().out
        assert out.startswith(f"[HINT {rung}/3] toy_median: " if rung < 3 else "[HINT 3/3] toy_median (the code):\n")
        assert (LADDER[rung - 1] if rung < 3 else "\n    return torch.sort(x).values[len(x) // 2]") in out
        assert all(other not in out for i, other in enumerate(LADDER[:2], start=1) if i != rung)
        assert (f'hint("toy_median", {rung + 1})' in out) == (rung < 3)
    assert "```" not in out  # the code rung shows code, not its markdown fence
    hint(ladder_exercise, 4)
    assert "the rung is 1" in capsys.readouterr().out


def test_a_failed_check_points_to_the_next_rung_never_to_the_code(ladder_exercise, capsys):
    wrong = lambda x: x.mean()  # noqa: E731
    result = run_check(ladder_exercise, wrong)
    assert not result.passed and "You took the mean" in result.message
    assert 'hint("toy_median")' in str(result) and "gives a nudge" in str(result)
    hint(ladder_exercise)  # the nudge, with what the last attempt got wrong, without its fix
    out = capsys.readouterr().out
    assert "About your last attempt: You took the mean." in out and "torch.sort`" not in out.split("attempt:")[1]
    result = run_check(ladder_exercise, wrong)
    assert 'hint("toy_median", 2)' in str(result) and 'hint("toy_median", 2)' in html.unescape(result._repr_html_())
    hint(ladder_exercise, 3)  # the code rung: now the whole diagnosis, fix included
    out = capsys.readouterr().out
    assert "You took the mean: the median is the middle value. Use `torch.sort`." in out
    result = run_check(ladder_exercise, wrong)  # after the code: pointed back to the approach, not the code
    for form in (str(result), html.unescape(result._repr_html_())):
        assert 'hint("toy_median", 2)' in form and 'hint("toy_median", 3)' not in form
        assert "solutions/" not in form and "return torch.sort" not in form
    assert run_check(ladder_exercise, lambda x: x.sort().values[1]).passed


def test_the_hint_cell_nests_two_rungs_and_points_to_hint_for_the_code(ladder_exercise, capsys):
    """The notebook's hint cell holds the nudge and, inside it, the approach; the code rung is not in it
    (the .ipynb would carry the solution): the cell says to run hint(name, 3), which shows it."""
    from rlhf_tutorial.checks import hint
    from rlhf_tutorial.notebooks import hint_markdown

    cell = hint_markdown(ladder_exercise)
    assert cell.count("<details>") == 2 and cell.count("</details>") == 2
    first, second = (cell.index(text) for text in LADDER[:2])
    assert first < second and cell.rindex("<details>") < second < cell.index("</details>")
    assert "Hint 2</b>: the approach" in cell[first:second]
    assert LADDER[2] not in cell and "torch.sort(x).values" not in cell
    pointer = cell.index('hint("toy_median", 3)')
    assert second < pointer < cell.index("</details>")  # inside the approach's rung
    hint(ladder_exercise, 3)
    assert "return torch.sort(x).values[len(x) // 2]" in capsys.readouterr().out


def test_a_hint_that_is_not_three_rungs_is_refused_at_registration():
    from rlhf_tutorial.checks import core

    for bad in (("one", "two"), ("one", "two", " "), ("a", "b", "c", "d")):
        with pytest.raises(ValueError, match="rungs"):
            core.checker("toy_bad", chapter="00_setup_and_tour", hint=bad)


def test_progress_shows_the_time_from_the_first_check_to_the_first_pass(monkeypatch, tmp_path):
    import json

    from rlhf_tutorial.checks import learner_progress as progress_module
    from rlhf_tutorial.notebooks import exercises, load_stub

    monkeypatch.delenv("RLHF_TUTORIAL_STRICT", raising=False)
    monkeypatch.setenv("RLHF_TUTORIAL_PROGRESS_FILE", str(tmp_path / "p.json"))
    clock = {"now": 1_000_000.0}
    monkeypatch.setattr(progress_module, "_now", lambda: clock["now"])
    estimate = next(e.meta.minutes for e in exercises() if e.name == "next_token_probs")

    with pytest.raises(NotImplementedError, match="exercise next_token_probs: not written yet"):
        check(load_stub("00_setup_and_tour", "next_token_probs"))  # the stub: the clock starts (and Run All stops)
    clock["now"] += 300
    check(lambda m, t: m(t)[:, -1], name="next_token_probs")  # a wrong attempt: still running
    row = progress_module.progress("00").rows[0]
    assert row[2] == "failed" and row[4] is None and "took" not in str(progress_module.progress("00"))
    clock["now"] += 425
    check(tour.next_token_probs)  # passes 725 s after the first check
    entry = json.loads((tmp_path / "p.json").read_text())["next_token_probs"]
    assert entry["first_check"] == 1_000_000.0 and entry["seconds_to_pass"] == 725.0 and entry["checks"] == 3
    clock["now"] += 5000
    check(tour.next_token_probs)  # checking again later changes neither the time nor the count
    check(lambda m, t: m(t)[:, -1], name="next_token_probs")
    entry = json.loads((tmp_path / "p.json").read_text())["next_token_probs"]
    assert (entry["seconds_to_pass"], entry["checks"], entry["status"]) == (725.0, 3, "failed")

    RESULTS.clear()  # a new kernel: the file remembers the time
    shown = progress_module.progress("00")
    assert shown.rows[0][4] == 725.0
    assert f"[!] next_token_probs (took 13 min, estimated {estimate})" in str(shown)
    assert f"took 13 min, estimated {estimate}" in shown._repr_html_()
    assert shown.timings() == [{"chapter": "00_setup_and_tour", "exercise": "next_token_probs",
                                "estimate_min": estimate, "taken_min": 12.1, "from_heading_min": None}]
    progress_module.reset_progress("00")  # forgetting an exercise forgets its clock
    check(tour.next_token_probs)  # passed at its first check: 0 min
    assert progress_module.progress("00").rows[0][4] == 0.0
    assert "took 0 min" in str(progress_module.progress("00"))


def test_progress_times_an_exercise_from_its_heading_when_the_learner_moved_straight_on(monkeypatch, tmp_path):
    """The span from the previous exercise's pass to this one's pass holds the reading and the writing
    before the first check; after a break (or with no previous pass) only the first-check clock is known."""
    import json

    from rlhf_tutorial.checks import learner_progress as progress_module
    from rlhf_tutorial.notebooks import exercises

    path = tmp_path / "p.json"
    monkeypatch.setenv("RLHF_TUTORIAL_PROGRESS_FILE", str(path))
    first, second = [e.name for e in exercises() if e.chapter == "00_setup_and_tour"][:2]
    clock = {"now": 1_000_000.0}
    monkeypatch.setattr(progress_module, "_now", lambda: clock["now"])

    def at(seconds, name, passed):
        clock["now"] = 1_000_000.0 + seconds
        progress_module.record(name, "00_setup_and_tour", passed)

    at(0, first, False)
    at(120, first, True)  # the first exercise: 2 min from its first check, nothing before it in the chapter
    at(420, second, False)  # 5 min of reading and writing, then the first check
    at(660, second, True)  # 4 more min of debugging
    rows = {r[1]: r for r in progress_module.progress("00").rows}
    assert (rows[first][4], rows[first][5]) == (120.0, None)
    assert (rows[second][4], rows[second][5]) == (240.0, 540.0)  # 9 min from the heading, 4 from the first check
    shown = str(progress_module.progress("00"))
    assert f"{second} (took 9 min from the heading" in shown and f"{first} (took 2 min," in shown
    assert "(in 11 min, estimated" in shown  # the chapter's sum uses the longer clock where known
    timing = {t["exercise"]: t for t in progress_module.progress("00").timings()}[second]
    assert (timing["taken_min"], timing["from_heading_min"]) == (4.0, 9.0)

    data = json.loads(path.read_text())  # the same, after a two-hour break before the second's first check
    data[second]["first_check"] = 1_000_000.0 + 120 + 2 * 3600
    path.write_text(json.dumps(data))
    rows = {r[1]: r for r in progress_module.progress("00").rows}
    assert (rows[second][4], rows[second][5]) == (240.0, None)
    data[second]["first_check"] = 1_000_000.0 + 60  # checked before the first passed: not straight on either
    path.write_text(json.dumps(data))
    assert {r[1]: r for r in progress_module.progress("00").rows}[second][5] is None


def test_timings_gathers_learners_files_into_medians_beside_the_estimates(tmp_path, capsys):
    """``python -m rlhf_tutorial timings FILE ...``: per exercise, the median over the learners who passed it
    (from the heading where known), flagged when it falls outside its difficulty's range; a missing or
    broken file is named, not fatal."""
    import json

    from rlhf_tutorial.cli import main as cli_main
    from rlhf_tutorial.notebooks import DIFFICULTY_MINUTES, exercises

    chapter = [e for e in exercises() if e.chapter == "00_setup_and_tour"][:2]
    first, second = chapter[0].name, chapter[1].name

    def learner(path, first_took, second_from_heading):
        t0 = 1_000_000.0
        record = {first: {"chapter": "00_setup_and_tour", "status": "passed", "first_check": t0,
                          "seconds_to_pass": first_took, "checks": 1},
                  second: {"chapter": "00_setup_and_tour", "status": "passed", "first_check": t0 + first_took + 30,
                           "seconds_to_pass": second_from_heading - 30, "checks": 2}}
        path.write_text(json.dumps(record))
        return path

    low, high = DIFFICULTY_MINUTES[chapter[1].meta.difficulty]
    files = [learner(tmp_path / f"{k}.json", 60.0 * k, 60.0 * (high + 10 * k)) for k in (1, 2, 3)]
    (tmp_path / "broken.json").write_text("{not json")
    assert cli_main(["timings", *map(str, files), str(tmp_path / "broken.json"), str(tmp_path / "absent.json"),
                     "--chapter", "00"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["learners"] == 3 and set(summary["unreadable"]) == {str(tmp_path / "broken.json"),
                                                                        str(tmp_path / "absent.json")}
    rows = {r["exercise"]: r for r in summary["exercises"]}
    assert rows[first]["median_min"] == 2.0 and rows[first]["from_heading"] == 0  # first of the chapter
    assert rows[second]["median_min"] == high + 20 and rows[second]["from_heading"] == 3
    assert rows[second]["estimate_min"] == chapter[1].meta.minutes and rows[second]["range_min"] == [low, high]
    assert rows[second]["outside_range"] and second in summary["outside_range"]
    low1, high1 = DIFFICULTY_MINUTES[chapter[0].meta.difficulty]
    assert rows[first]["outside_range"] == (not low1 <= 2.0 <= high1)


def test_every_estimate_lies_in_its_difficultys_range():
    from rlhf_tutorial.notebooks import DIFFICULTY_MINUTES, exercises

    outside = [(e.name, e.meta.difficulty, e.meta.minutes) for e in exercises()
               if not DIFFICULTY_MINUTES[e.meta.difficulty][0] <= e.meta.minutes <= DIFFICULTY_MINUTES[e.meta.difficulty][1]]
    assert not outside, outside


def test_an_old_or_damaged_progress_record_still_shows(monkeypatch, tmp_path):
    import json

    from rlhf_tutorial.checks import learner_progress as progress_module

    path = tmp_path / "p.json"
    monkeypatch.setenv("RLHF_TUTORIAL_PROGRESS_FILE", str(path))
    path.write_text(json.dumps({"next_token_probs": {"chapter": "00_setup_and_tour", "status": "passed"},
                                "final_normalized_residual": {"chapter": "00_setup_and_tour", "status": "failed",
                                                              "first_check": "yesterday", "seconds_to_pass": None}}))
    rows = progress_module.progress("00").rows
    assert [r[2] for r in rows] == ["passed", "failed"] and [r[4] for r in rows] == [None, None]
    monkeypatch.setattr(progress_module, "_now", lambda: 50.0)
    progress_module.record("final_normalized_residual", "00_setup_and_tour", True)  # "yesterday" is no time
    assert json.loads(path.read_text())["final_normalized_residual"]["seconds_to_pass"] == 0.0


def test_checking_an_untouched_stub_stops_run_all_with_the_exercise_name(capsys, monkeypatch):
    """Run All must stop at the first exercise not written yet, even where no later cell calls it."""
    from rlhf_tutorial.notebooks import load_stub

    monkeypatch.delenv("RLHF_TUTORIAL_STRICT", raising=False)
    with pytest.raises(NotImplementedError, match=r"^exercise compute_gae: not written yet"):
        check(load_stub("01_ppo", "compute_gae"))
    assert "[FAILED] compute_gae" in capsys.readouterr().out  # the verdict is shown first
    check(lambda *a, **k: 1 / 0, name="compute_gae")  # a written but wrong attempt: a verdict, no exception
    assert "ZeroDivisionError" in capsys.readouterr().out


@pytest.mark.parametrize("hint, short", [
    ("Trailing spaces after the number are allowed ('Answer: 2   ' is 2). Strip them.",
     "Trailing spaces after the number are allowed ('Answer: 2   ' is 2)."),
    ("Build new tensors with an explicit dtype (e.g. float32): the reference's.",
     "Build new tensors with an explicit dtype (e.g. float32)."),
    ('The line must be "Answer: N" exactly. Anything else is no answer.', 'The line must be "Answer: N" exactly.'),
    ("Keep `else: raise ValueError(...)` whole; then more.", "Keep `else: raise ValueError(...)` whole."),
    ("The learner's sum is per row: use one sum.", "The learner's sum is per row."),
    ("Indices [a: b] are fine here. More.", "Indices [a: b] are fine here."),
    ("No separator at all", "No separator at all."),
])
def test_the_nudge_is_never_cut_inside_quotes_parentheses_or_code(hint, short):
    from rlhf_tutorial.checks.core import nudge

    assert nudge(hint) == short


def test_a_known_mistake_is_named_only_when_it_agrees_on_every_case_run(scratch_checker):
    """A mistake that matches the candidate on the failing case but not on a case the candidate passed
    is not what the candidate did: no diagnosis rather than a wrong one."""
    from rlhf_tutorial.checks.core import Case, Mistake, checker, compare_to_reference

    def reference(x):
        return x.abs()

    def negatives_wrong(x):  # wrong on every negative entry
        return x.clone()

    @checker("_agree", chapter="_scratch", hint="a nudge about the absolute value")
    def check(candidate):
        cases = [Case("negatives", (torch.tensor([-1.0, -2.0]),)), Case("large", (torch.tensor([-1e6, 3.0]),))]
        return compare_to_reference(candidate, reference, cases,
                                    mistakes=[Mistake("You returned x itself: negatives stay negative.", negatives_wrong)])

    try:
        # right on the first case, wrong on the second exactly as negatives_wrong is: but negatives_wrong
        # fails the first case, so it is not this candidate's mistake
        def clamps_large(x):
            return torch.where(x.abs() > 1e3, x, x.abs())

        result = run_check("_agree", clamps_large)
        assert not result.passed and "You returned x itself" not in result.message
        result = run_check("_agree", negatives_wrong)
        assert not result.passed and "You returned x itself" in result.message
    finally:
        from rlhf_tutorial.checks.core import REGISTRY

        REGISTRY.pop("_agree", None)


def test_a_module_converted_in_place_is_the_learners_change():
    """call() fails, naming the argument and both dtypes, when the learner's code converts a module it was
    given to another dtype (in place for the caller); the same conversion on a copy is fine."""
    import copy

    from rlhf_tutorial.checks.core import CheckFailure, call

    def in_place(x, layer):
        return layer.double()(x.double()).float()

    def on_a_copy(x, layer):
        return copy.deepcopy(layer).double()(x.double()).float()

    layer = torch.nn.Linear(3, 2)
    with pytest.raises(CheckFailure) as failed:
        call(in_place, torch.ones(1, 3), layer, _arg_names=["x", "layer"])
    assert "`layer`" in failed.value.message and "float64" in failed.value.message, failed.value.message
    assert "float32" in failed.value.message, failed.value.message
    layer = torch.nn.Linear(3, 2)
    call(on_a_copy, torch.ones(1, 3), layer, _arg_names=["x", "layer"])
    assert layer.weight.dtype == torch.float32
