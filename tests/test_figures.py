"""Figures the prose quotes are tied to the runs that make them (rlhf_tutorial/figures.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf_tutorial import figures, notebooks
from rlhf_tutorial.figures import Run

FAKE = {
    "demo": {"command": "python -m rlhf_tutorial demo", "recorded": "2026-11-26",
             "machine": {"cpu": "Test CPU", "torch_build": {"cpu_capability": "AVX2"}},
             "summary": {"mean_reward_final": 0.955, "kl_final": 0.5452, "phases": 40,
                         "seconds_per_phase": {"sampling": 0.0551}, "kl_per_phase": [0.0, 0.12, 0.3]}},
}


def course_markdown() -> dict[str, str]:
    """Every markdown cell of the course sources, by source file."""
    return {src.name: "\n".join(c.source for c in notebooks.parse_source(src.read_text()) if c.kind == "markdown")
            for src in notebooks.sources()}


def test_every_quoted_figure_is_a_recorded_one():
    texts = {**course_markdown(), "README.md": figures.README.read_text()}
    quoted = {name: figures.placeholders(text) for name, text in texts.items()}
    assert sum(map(len, quoted.values())) >= 20, quoted  # the chapters and README do quote through it
    recorded = figures.recorded()
    for refs in quoted.values():
        for ref in refs:
            figures.lookup(ref, recorded)  # raises, naming the run and key, when it is not recorded
    for run_name in {ref.split(".")[0] for refs in quoted.values() for ref in refs}:
        run = figures.SPREADS[run_name] if run_name in figures.SPREADS else figures.RUNS[run_name]
        assert recorded[run_name]["command"] == run.command, (
            f"{run_name}: recorded with another command line than figures.RUNS says: record it again")
        if run_name in figures.SPREADS:  # a spread is its runs' records as they are now
            assert recorded[run_name]["summary"] == figures.spread_summary(run, recorded), f"record-figures {run_name}"


def test_the_readme_quotes_the_recorded_figures():
    text = figures.README.read_text()
    assert figures.sync_readme(text) == text, "the README is stale: run `python -m rlhf_tutorial build-notebooks`"


def test_substitute_and_lookup():
    text = "reward {{demo.mean_reward_final}} at KL {{demo.kl_final:.3f}}, sampling {{demo.seconds_per_phase.sampling:.3f}} s"
    assert figures.substitute(text, FAKE) == "reward 0.95 at KL 0.545, sampling 0.055 s"  # 0.955 rounds half-even
    assert figures.substitute("last {{demo.kl_per_phase.-1:.1f}} of {{demo.phases}}", FAKE) == "last 0.3 of 40"
    with pytest.raises(KeyError, match="no recorded run 'nope'.*record-figures nope"):
        figures.substitute("{{nope.kl_final}}", FAKE)
    with pytest.raises(KeyError, match="has no 'kl_typo'"):
        figures.substitute("{{demo.kl_typo}}", FAKE)


def test_lookup_finds_a_key_that_holds_a_dot():
    scan = {"scan": {"1": {"0.3": {"kl": 0.5}, "0": {"kl": 0.1}, "3": {"kl": 2.0}}}}
    runs = {"scan_demo": {"command": "python -m rlhf_tutorial compare-lora", "summary": scan}}
    assert figures.lookup("scan_demo.scan.1.0.3.kl", runs) == 0.5
    assert figures.lookup("scan_demo.scan.1.3.kl", runs) == 2.0
    with pytest.raises(KeyError, match="has no 'scan.1.0.4.kl'"):
        figures.lookup("scan_demo.scan.1.0.4.kl", runs)


def test_sync_readme_keeps_the_decimals_and_only_touches_tagged_numbers():
    text = "| 0.917<!--fig demo.mean_reward_final--> at KL +0.61<!--fig demo.kl_final--> in 40 phases, 0.917 |"
    assert figures.sync_readme(text, FAKE) == (
        "| 0.955<!--fig demo.mean_reward_final--> at KL +0.55<!--fig demo.kl_final--> in 40 phases, 0.917 |")


def test_sync_readme_writes_scientific_figures_as_they_were_written():
    figs = {"demo": {**FAKE["demo"], "summary": {"diff": 5.6619e-06, "big": 123456.0}}}
    assert figures.sync_readme("at most 9.9e-9<!--fig demo.diff-->, 1.0e5<!--fig demo.big-->", figs) == (
        "at most 5.7e-6<!--fig demo.diff-->, 1.2e5<!--fig demo.big-->")


def here_fake() -> dict:
    """FAKE, recorded on this very machine."""
    from rlhf_tutorial.buildinfo import build_info

    return {"demo": {**json.loads(json.dumps(FAKE["demo"])), "machine": build_info()}}  # a deep copy


def test_a_stale_figure_fails_the_notebook_under_nbval(monkeypatch, capsys):
    """The text quotes 0.867 (stale) while the run prints 0.955: strict (CI's nbval) raises, a learner gets a note."""
    stale = here_fake()
    stale["demo"]["summary"]["mean_reward_final"] = 0.917 - 0.05  # beyond the reward band of 0.05
    monkeypatch.setattr(figures, "recorded", lambda path=None: stale)
    monkeypatch.setitem(figures.RUNS, "demo", Run(("demo",)))
    monkeypatch.setenv("RLHF_TUTORIAL_STRICT", "1")
    with pytest.raises(AssertionError, match=r"(?s)mean_reward_final: this run 0.955, the text 0.867.*record-figures demo"):
        figures.agree("demo", {"mean_reward_final": 0.955}, world="tiny", smoke=False)
    monkeypatch.setenv("RLHF_TUTORIAL_STRICT", "0")
    assert figures.agree("demo", {"mean_reward_final": 0.955}, world="tiny", smoke=False) is False
    assert "this run differs" in capsys.readouterr().out
    # Within the bands: a reward 0.04 away, a KL 30% away (another CPU), a time (never compared).
    assert figures.agree("demo", {"kl_final": 0.5452 * 1.3, "seconds_per_phase.sampling": 9.0}, world="tiny", smoke=False)
    monkeypatch.setattr(figures, "recorded", lambda path=None: here_fake())
    assert figures.agree("demo", {"mean_reward_final": 0.955 - 0.04}, world="tiny", smoke=False)
    # Another world's run, or a smoke run, is not held to the tiny world's figures.
    monkeypatch.setattr(figures, "recorded", lambda path=None: stale)
    monkeypatch.setenv("RLHF_TUTORIAL_STRICT", "1")
    assert figures.agree("demo", {"mean_reward_final": 0.955}, world="gpt2", smoke=False)
    assert figures.agree("demo", {"mean_reward_final": 0.955}, world="tiny", smoke=True)


def test_another_cpu_gets_wider_bands_but_not_unlimited_ones(monkeypatch):
    """Recorded on another CPU (FAKE's 'Test CPU'), a run rounds differently from its first step: a reward
    0.15 off is within the wide band there, 0.25 off is not; on this machine's own recording 0.15 fails."""
    assert not figures.same_machine(FAKE["demo"]["machine"])
    assert figures.same_machine(here_fake()["demo"]["machine"])
    monkeypatch.setenv("RLHF_TUTORIAL_STRICT", "1")
    monkeypatch.setitem(figures.RUNS, "demo", Run(("demo",)))
    monkeypatch.setattr(figures, "recorded", lambda path=None: FAKE)
    assert figures.agree("demo", {"mean_reward_final": 0.955 - 0.15}, world="tiny", smoke=False)
    with pytest.raises(AssertionError, match="rounds differently"):
        figures.agree("demo", {"mean_reward_final": 0.955 - 0.25}, world="tiny", smoke=False)
    monkeypatch.setattr(figures, "recorded", lambda path=None: here_fake())
    with pytest.raises(AssertionError, match="computes like it"):
        figures.agree("demo", {"mean_reward_final": 0.955 - 0.15}, world="tiny", smoke=False)


def test_a_kl_off_by_a_third_more_than_its_band_fails():
    assert figures.disagreements("demo", {"kl_final": 0.5452 * 1.45}, FAKE)
    assert not figures.disagreements("demo", {"kl_final": 0.5452 * 0.65}, FAKE)


@pytest.mark.timeout(120)
def test_record_runs_the_command_and_keeps_its_summary(tmp_path, monkeypatch):
    """record-figures runs each command in a fresh process and stores its last-line summary and the machine."""
    monkeypatch.setitem(figures.RUNS, "nb_check", Run(("build-notebooks", "--check")))
    path = tmp_path / "figures.json"
    path.write_text(json.dumps(FAKE))
    out = figures.record(["nb_check"], path)
    assert set(out) == {"demo", "nb_check"}  # an earlier run is kept
    entry = out["nb_check"]
    assert entry["command"] == "python -m rlhf_tutorial build-notebooks --check"
    assert entry["summary"]["stale"] == [] and "sources" in entry["summary"]
    assert entry["machine"]["torch_build"]["version"].startswith("2.")
    with pytest.raises(SystemExit, match="unknown run"):
        figures.record(["no_such_run"], path)


def test_a_run_under_another_kernel_level_runs_and_records_under_it(tmp_path, monkeypatch):
    """A Run's env (ATEN_CPU_CAPABILITY=default: torch's unvectorised kernels) is part of its command line, and
    both the command and the machine it is recorded with run under it."""
    level = (("ATEN_CPU_CAPABILITY", "default"),)
    code = "import json, torch; print(json.dumps({'level': torch.backends.cpu.get_cpu_capability()}))"
    monkeypatch.setattr(figures, "run_summary", lambda run: json.loads(subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **dict(run.env)}).stdout))
    monkeypatch.setitem(figures.RUNS, "levelled", Run(("world-info",), env=level))
    assert figures.RUNS["levelled"].command == "ATEN_CPU_CAPABILITY=default python -m rlhf_tutorial world-info"
    path = tmp_path / "figures.json"
    entry = figures.record(["levelled"], path)["levelled"]
    assert entry["summary"]["level"] == "DEFAULT"
    assert entry["machine"]["torch_build"]["cpu_capability"] == "DEFAULT"
    assert entry["machine"]["kernel_env"] == {"ATEN_CPU_CAPABILITY": "default"}
    assert Run(("world-info",)).command == "python -m rlhf_tutorial world-info"


def test_a_spread_is_written_from_its_seeds_records(tmp_path, monkeypatch):
    """record-figures NAME of a Spread runs nothing: it summarises its runs' records (range, mean, sample std), and
    refuses while one of them is not recorded."""
    seeds = {f"demo_s{i}": {**FAKE["demo"], "summary": {"seed": i, "gain": g, "other": 1}}
             for i, g in enumerate((0.31, 0.4, 0.35))}
    path = tmp_path / "figures.json"
    path.write_text(json.dumps(seeds))
    monkeypatch.setitem(figures.SPREADS, "demo_spread", figures.Spread(tuple(seeds), ("gain",)))
    entry = figures.record(["demo_spread"], path)["demo_spread"]
    assert entry["command"] == "record-figures: the spread over demo_s0, demo_s1, demo_s2"
    assert entry["summary"] == {"seeds": [0, 1, 2], "n_seeds": 3, "runs": list(seeds), "over_seeds": {"gain": {
        "per_seed": [0.31, 0.4, 0.35], "min": 0.31, "max": 0.4, "mean": 0.3533, "std": 0.0451}}}
    assert entry["machine"] == FAKE["demo"]["machine"]
    monkeypatch.setitem(figures.SPREADS, "demo_spread", figures.Spread(("demo_s0", "demo_s9"), ("gain",)))
    with pytest.raises(KeyError, match="record-figures demo_s9"):
        figures.record(["demo_spread"], path)


# Numbers with two or more decimals that the chapters' prose may state outright: settings, arithmetic and
# versions, not measurements. Anything else of that form is a run's figure and must come from figures.json.
NOT_RUN_FIGURES = {
    "01_ppo": {"0.01"},  # the actor's output gain
    "03_rlhf_ppo": {"0.13", "0.64", "0.02", "0.01", "0.25"},  # the controller's arithmetic; settings
    "04_grpo": {"0.04", "1.12"},  # DeepSeekMath's beta; TRL's version
    "06_dpo_and_frontier": {"0.01", "0.02", "0.03"},  # betas of the grid
}
_DECIMAL = re.compile(r"(?<![\w.{$\\^_-])(\d+\.\d{2,})(?![\w.}%])")


def unrecorded_figures(chapter: str, markdown: str) -> list[str]:
    """Two-or-more-decimal numbers in prose (outside math, code and placeholders) that are not listed as
    settings: each one is a run figure typed by hand."""
    text = re.sub(r"\{\{[^}]*\}\}", "", markdown)
    text = re.sub(r"\$\$.*?\$\$", "", text, flags=re.S)
    text = re.sub(r"\$[^$\n]*\$|`[^`\n]*`", "", text)
    allowed = NOT_RUN_FIGURES.get(chapter, set())
    return [f"{chapter}: {m[1]} in '...{text[max(0, m.start() - 40):m.end() + 15]}...'".replace("\n", " ")
            for m in _DECIMAL.finditer(text) if m[1] not in allowed]


def test_no_run_figure_is_typed_by_hand():
    found = [line for name, text in course_markdown().items() for line in unrecorded_figures(name[:-3], text)]
    assert not found, "figures typed by hand (record them: rlhf_tutorial/figures.py):\n" + "\n".join(found)


def test_the_typed_figure_check_catches_a_stale_figure():
    found = unrecorded_figures("03_rlhf_ppo", "The run ends at reward 0.95 and KL 0.28 per token.")
    assert [line.split(" in ")[0] for line in found] == ["03_rlhf_ppo: 0.95", "03_rlhf_ppo: 0.28"]
    assert "reward 0.95 and KL" in found[0]
    assert unrecorded_figures("03_rlhf_ppo", "reward {{rlhf_neg.mean_reward_final:.2f}}, $\\beta = 0.25$, `0.55`") == []


def test_the_readmes_gpu_figures_are_the_recorded_gpu_runs():
    """The README's GPU figures cannot come from ``figures.RUNS`` (CI has no GPU): they are quoted from the
    summaries that ``make test-gpu``'s logs were written into (docs/gpu/), and must say what they say: the
    last run's counts and figures, and the race's ratio in every run."""
    import re

    root = Path(__file__).resolve().parents[1]
    first = json.loads((root / "docs" / "gpu" / "h100-2026-11-26.json").read_text())
    run = json.loads((root / "docs" / "gpu" / "h100-2026-11-26-rerun.json").read_text())
    readme = re.sub(r"\s+", " ", (root / "README.md").read_text()).replace("**", "")
    race, phase = run["figures"]["gpt2_small_grpo_race"], run["figures"]["gpt2_small_rlhf_phase"]["chunked"]
    ours, trl = race["median"]["ours"], race["median"]["trl"]
    split, ratio = race["median_seconds_per_phase_split"], race["ratio_ours_over_trl"]
    passed, skipped = re.match(r"(\d+) passed, (\d+) skipped", run["suites"]["unit"]).groups()
    nbval = [re.match(r"(\d+) passed", run["suites"][s]).group(1) for s in ("nbval-tiny", "nbval-gpt2")]
    ratios = [r["figures"]["gpt2_small_grpo_race"]["ratio_ours_over_trl"]["seconds_per_phase"] for r in (first, run)]
    ratios.insert(1, run["run_before"]["gpt2_small_grpo_race"]["ratio_ours_over_trl"]["seconds_per_phase"])
    quoted = [
        f"the unit suite {passed} passed, 0 failed, {skipped} skipped",
        f"nbval in the tiny world {nbval[0]} of {nbval[0]} cells and in the GPT-2 world (stand-in cache, smoke "
        f"size) {nbval[1]} of {nbval[1]}",
        f"{ours['seconds_per_phase']:.3f} s a phase for ours "
        f"(sampling {split['ours']['sampling']:.3f}, reference {split['ours']['ref_logprobs']:.3f}, optimisation "
        f"{split['ours']['optimisation']:.3f})",
        f"against {trl['seconds_per_phase']:.3f} s for TRL (sampling {split['trl']['sampling']:.3f}, old log-probs "
        f"{split['trl']['old_logprobs']:.3f}, reference {split['trl']['ref_logprobs']:.3f}, optimisation "
        f"{split['trl']['optimisation']:.3f})",
        f"ours / TRL {ratio['seconds_per_phase']:.2f}",
        "Across the three runs the ratio was " + ", ".join(f"{r:.2f}" for r in ratios[:2]) + f" and {ratios[2]:.2f}",
        f"the loaded policy {ours['loaded_memory_mb']:.0f} MB of CUDA memory on each",
        f"training above it {ours['peak_memory_mb']:.0f} MB for ours and {trl['peak_memory_mb']:.0f} MB for TRL "
        f"({ratio['peak_memory_mb']:.2f})",
        f"the whole process's peak {ours['process_peak_mb']:.0f} MB and {trl['process_peak_mb']:.0f} MB "
        f"({ratio['process_peak_mb']:.2f})",
        f"took {phase['phase_seconds']} s, with a peak of {phase['phase_peak_mb']:.0f} MB of CUDA",
        f"every CLI command ({len(run['cli'])} of them",
    ]
    assert round(trl["loaded_memory_mb"]) == round(ours["loaded_memory_mb"])  # "on each"
    assert not run["failures"] and all(v["ok"] for v in run["cli"].values())
    assert run["cli_other_device"] and all(v["device"].startswith("cuda") for k, v in run["cli"].items()
                                           if k not in run["cli_other_device"])
    missing = [q for q in quoted if q not in readme]
    assert not missing, missing


def test_no_notebook_cell_echoes_the_agreement():
    """A cell whose last statement is ``figures.agree(...)`` would print a stray ``True`` under the cell's
    output; such a call ends with ``;`` (or comes before the cell's last statement)."""
    import ast

    root = Path(__file__).resolve().parents[1]
    echoed = []
    for path in sorted((root / "solutions").glob("*.ipynb")):
        for index, cell in enumerate(json.loads(path.read_text())["cells"]):
            source = "".join(cell["source"])
            if cell["cell_type"] != "code" or "agree(" not in source:
                continue
            last = ast.parse(source).body[-1]
            if isinstance(last, ast.Expr) and "agree(" in ast.unparse(last).split("\n")[0]:
                line = source.split("\n")[last.end_lineno - 1]
                if not line[last.end_col_offset:].lstrip().startswith(";"):
                    echoed.append(f"{path.name} cell {index}")
    assert not echoed, echoed


def spread_fake() -> dict:
    """FAKE (another CPU) with a multi-seed run of its settings: seed 0 ended at 0.955, the others lower."""
    figs = json.loads(json.dumps(FAKE))
    figs["demo_seeds"] = {"command": "python -m rlhf_tutorial demo --seeds 0 1 2", "recorded": "2026-11-26",
                          "machine": FAKE["demo"]["machine"],
                          "summary": {"mean_reward_final": {"per_seed": [0.955, 0.62, 0.7], "min": 0.62, "max": 0.955,
                                                            "mean": 0.7583, "std": 0.1749}}}
    return figs


def test_a_seed_spread_sets_the_band_on_another_cpu(monkeypatch):
    """A run that swings with the seed is held, on another CPU, to its measured spread (range +- one std):
    0.5 (far outside band()'s 0.2 of 0.955) agrees, 0.4 does not, and the message names the seeds."""
    figs = spread_fake()
    monkeypatch.setitem(figures.SEED_SPREADS, "demo", "demo_seeds")
    assert figures.seed_band(figs["demo_seeds"]["summary"]["mean_reward_final"]) == pytest.approx((0.4451, 1.1299))
    assert not figures.disagreements("demo", {"mean_reward_final": 0.5}, figs, same=False)
    assert not figures.disagreements("demo", {"mean_reward_final": 0.955 - 0.15}, figs, same=False)
    (line,) = figures.disagreements("demo", {"mean_reward_final": 0.4}, figs, same=False)
    assert "[0.955, 0.62, 0.7]" in line and "demo_seeds" in line and "0.4451" in line
    # keys the spread did not measure keep band(); on the recording's own machine the tight band holds
    assert figures.disagreements("demo", {"kl_final": 0.5452 * 1.9}, figs, same=False)
    assert figures.disagreements("demo", {"mean_reward_final": 0.5}, figs, same=True)
    # without the declaration the spread is not used
    monkeypatch.delitem(figures.SEED_SPREADS, "demo")
    assert figures.disagreements("demo", {"mean_reward_final": 0.5}, figs, same=False)


def test_every_declared_seed_spread_is_a_run_that_measures_its_figures():
    recorded = figures.recorded()
    for name, spread_run in figures.SEED_SPREADS.items():
        assert name in figures.RUNS and spread_run in figures.RUNS
        assert recorded[spread_run]["command"] == figures.RUNS[spread_run].command
        spread = recorded[spread_run]["summary"]
        assert len(spread["seeds"]) >= 3, "a spread over fewer than three seeds justifies no band"
        for rank, stats in spread["runs"].items():
            for key in ("mean_reward_final", "kl_final"):
                values = stats[key]["per_seed"]
                assert stats[key]["min"] == min(values) and stats[key]["max"] == max(values)
                figures.lookup(f"{name}.runs.{rank}.{key}", recorded)  # the figure it bands exists


def test_every_markdown_table_row_has_as_many_cells_as_its_header():
    """A row with a cell too many (a stray ``|``, e.g. left by a merge) renders as a broken table."""
    import re

    root = Path(__file__).resolve().parents[1]
    broken = []
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        header = None
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.startswith("|"):
                header = None
                continue
            cells = re.sub(r"`[^`]*`", "", line).replace("\\|", "").count("|")
            if header is None:
                header = cells
            elif cells != header:
                broken.append(f"{path.name}:{number}: {cells - 1} cells, the header has {header - 1}")
    assert not broken, broken
