"""Figures the prose quotes, tied to the runs that make them.

A number the chapters or the README quote from a run (a reward, a KL, an accuracy, a time) is never
typed by hand. It lives in one place, ``figures.json`` beside this file, written by one command:

- :data:`RUNS` names each run by its command line (``python -m rlhf_tutorial <argv>``);
- ``python -m rlhf_tutorial record-figures [NAME ...]`` runs them (all, or the named ones) and stores
  each one's last-line JSON summary with the machine it ran on (:func:`rlhf_tutorial.buildinfo.build_info`:
  "the reference machine" in the text);
- ``course/*.py`` markdown writes ``{{NAME.KEY}}`` or ``{{NAME.KEY:FORMAT}}`` (``{{rlhf_neg.kl_final:.2f}}``;
  a KEY may go into a dict or list: ``seconds_per_phase.sampling``, ``kl_coef_per_phase.-1``), and
  ``build-notebooks`` writes the recorded value in its place; the README writes the number followed by
  ``<!--fig NAME.KEY-->`` and :func:`sync_readme` (run by ``record-figures`` and ``build-notebooks``)
  rewrites it with the same number of decimals; a test fails when the README is stale;
- a solution notebook that runs what its text quotes calls :func:`agree` with what it printed: beyond
  the tolerance of :func:`band` that is an error under nbval (``RLHF_TUTORIAL_STRICT=1``, CI) and a note
  to the learner otherwise (other CPUs round differently: the figures are the reference machine's).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIGURES_FILE = Path(__file__).with_name("figures.json")
README = Path(__file__).resolve().parent.parent / "README.md"


@dataclass(frozen=True)
class Run:
    """A command whose summary the prose quotes. ``world`` is the world its figures belong to: a
    notebook checks its own output against them only there (and never at smoke sizes). ``env``: environment
    variables the command runs under (``ATEN_CPU_CAPABILITY``: the same run at another kernel level)."""

    argv: tuple[str, ...]
    world: str = "tiny"
    env: tuple[tuple[str, str], ...] = ()

    @property
    def command(self) -> str:
        return "".join(f"{k}={v} " for k, v in self.env) + "python -m rlhf_tutorial " + " ".join(self.argv)


#: Every run the prose quotes, by name. Keep the names short: they appear in the course's markdown.
RUNS: dict[str, Run] = {
    # chapter 03's notebook runs these with the learner's get_samples and value head, which the trainer then runs
    # as written (its faster sampler and forward only replace the reference pieces): --no-fast reproduces that run
    "rlhf_neg": Run(("train-rlhf", "--world", "tiny", "--direction", "neg", "--seed", "0", "--no-fast")),
    "rlhf_adaptive": Run(("train-rlhf", "--world", "tiny", "--direction", "neg", "--seed", "0", "--adaptive-kl")),
    "grpo_neg": Run(("train-grpo", "--world", "tiny", "--direction", "neg", "--seed", "0")),
    # chapter 03: the advantage estimators, 20 phases of 32
    "rlhf_one_step": Run(("train-rlhf", "--world", "tiny", "--seed", "0", "--num-phases", "20", "--batch-size", "32",
                          "--advantage-estimator", "one_step")),
    "rlhf_gae": Run(("train-rlhf", "--world", "tiny", "--seed", "0", "--num-phases", "20", "--batch-size", "32",
                     "--advantage-estimator", "gae")),
    # chapter 03: reward hacking, 40 aggressive phases of 32
    **{name: Run(("train-rlhf", "--world", "tiny", "--seed", "0", "--batch-size", "32", "--num-phases", "40",
                  "--learning-rate", "1e-3", "--head-lr", "3e-3", "--no-early-stopping", "--no-fast", *extra))
       for name, extra in {
           "hack_tiny_beta": ("--kl-coef", "0.001"),
           "hack_tiny_beta_rep": ("--kl-coef", "0.001", "--repetition-coef", "1.0"),
           "hack_rep_adaptive": ("--kl-coef", "0.1", "--repetition-coef", "1.0", "--adaptive-kl", "--kl-target", "0.25",
                                 "--kl-horizon", "128"),
       }.items()},
}

# Chapter 03: reward over-optimisation against a proxy reward model (chapter 02's).
RUNS["overopt"] = Run(("overoptimization", "--world", "tiny", "--seed", "0"))
RUNS["overopt_s1"] = Run(("overoptimization", "--world", "tiny", "--seed", "1"))
# Chapter 02: the Bradley-Terry reward model; chapter 05: the interpretability report on the shipped tuned policy.
RUNS["reward_model"] = Run(("train-reward-model", "--world", "tiny", "--seed", "0"))
RUNS["interp"] = Run(("interp-report", "--world", "tiny", "--seed", "0"))
RUNS["world"] = Run(("world-info", "--world", "tiny"))
RUNS["cartpole"] = Run(("train-ppo", "--env", "CartPole-v1", "--seed", "1"))
RUNS["export"] = Run(("export-hf", "--world", "tiny", "--out", "/tmp/rlhf_tutorial_figures/policy_hf"))
RUNS["cartpole_40k"] = Run(("train-ppo", "--env", "CartPole-v1", "--seed", "1", "--total-timesteps", "40000"))

# The races against TRL and the GPT-2-sized memory probe (README; chapter 04 quotes the GRPO race).
RUNS["bench_grpo"] = Run(("bench-trl", "--algo", "grpo"))
RUNS["bench_dpo"] = Run(("bench-trl", "--algo", "dpo"))
RUNS["bench_ppo"] = Run(("bench-trl", "--algo", "ppo"))
RUNS["bench_memory"] = Run(("bench-memory",))
# The same races on a GPT-2-small-shaped policy (issue 23): time and memory only, 2 threads.
for _algo in ("grpo", "ppo", "dpo"):
    RUNS[f"bench_{_algo}_gpt2"] = Run(("bench-trl", "--algo", _algo, "--size", "gpt2"))

# Chapters 04 and 06.
_TINY_NEG = ("--world", "tiny", "--direction", "neg", "--seed", "0")
RUNS.update({
    # chapter 06 (section 6): the notebook's short GRPO run, and RLOO and GSPO beside it
    **{name: Run(("train-grpo", *_TINY_NEG, "--num-phases", "12", "--eval-samples", "64", *extra))
       for name, extra in {
           "grpo_short": (),
           "rloo_short": ("--advantage-estimator", "rloo"),
           "gspo_short": ("--importance-level", "sequence"),
           # chapter 04 (section 10): REINFORCE++'s advantages and CISPO's objective in the same run
           "reinforce_pp_short": ("--advantage-estimator", "reinforce_pp"),
           "cispo_short": ("--policy-loss", "cispo"),
           # chapter 04 (section 10): a bfloat16 sampler beside the float32 trainer, without and with the correction
           "mismatch_bf16": ("--sampler-dtype", "bfloat16"),
           "mismatch_bf16_tis": ("--sampler-dtype", "bfloat16", "--tis-cap", "2.0"),
       }.items()},
    # chapter 04 (section 5) runs it with the learner's sample_group, which the trainer then samples with (not with
    # its own faster sampler): --no-fast reproduces that run
    "grpo_short_nofast": Run(("train-grpo", *_TINY_NEG, "--num-phases", "12", "--eval-samples", "64", "--no-fast")),
    # chapter 06 (section 5): DPO, the CLI's runs and the notebook's two shortened ones
    "dpo_offline": Run(("train-dpo", *_TINY_NEG)),
    "dpo_online": Run(("train-dpo", *_TINY_NEG, "--online", "--group-size", "8", "--num-pairs", "256")),
    "dpo_short": Run(("train-dpo", *_TINY_NEG, "--num-pairs", "192", "--rounds", "3", "--eval-samples", "64",
                      "--eval-samples-per-round", "48")),
    "dpo_prefs": Run(("train-dpo", *_TINY_NEG, "--pairs", "preferences", "--num-pairs", "384", "--rounds", "2",
                      "--eval-samples", "64", "--eval-samples-per-round", "32")),
    # chapter 06 (section 5): KTO and ORPO through the DPO trainer, on the same pairs as dpo_short
    **{f"{loss}_short": Run(("train-dpo", *_TINY_NEG, "--num-pairs", "192", "--rounds", "3", "--eval-samples", "64",
                             "--eval-samples-per-round", "48", "--loss-type", loss)) for loss in ("kto", "orpo")},
    # chapter 06 (section 7): the full frontier grid, and the notebook's smaller one (in one process, as there)
    "frontier": Run(("frontier", "--world", "tiny")),
    "frontier_short": Run(("frontier", "--world", "tiny", "--ppo-kl-coefs", "0.1", "0.3", "--grpo-kl-coefs", "0.1", "0.5",
                           "--dpo-betas", "0.03", "0.5", "--ipo-betas", "0.02", "0.5", "--rl-phases", "20",
                           "--dpo-rounds", "6", "--dpo-pairs", "128", "--eval-samples", "64", "--no-isolate",
                           "--methods", "ppo", "grpo", "rloo", "gspo", "dpo", "ipo", "kto", "orpo", "reinforce_pp", "cispo",
                           "--kto-betas", "0.1", "--orpo-lambdas", "0.1", "--reinforce-pp-kl-coefs", "0.03", "0.3")),
})

# TRL with 2 data-parallel processes launched by accelerate on the CPU (chapter 04, section 11; README).
RUNS["scale_grpo"] = Run(("scale-trl", "--world", "tiny", "--num-processes", "2", "--algo", "grpo"))
RUNS["scale_dpo"] = Run(("scale-trl", "--world", "tiny", "--num-processes", "2", "--algo", "dpo"))

# Chapter 07.
_TINY_0 = ("--world", "tiny", "--seed", "0")
RUNS.update({
    "sft": Run(("train-sft", *_TINY_0)),
    "rejection_sampling": Run(("train-rejection-sampling", *_TINY_0)),
    # GRPO on arithmetic, one run per seed (the text quotes their mean and spread: SPREADS["grpo_arith"], and seed 0's
    # details), and the same seeds at the avx2 and the unvectorised ('default') kernel levels: other CPUs round as these do
    **{f"grpo_arith_s{seed}": Run(("train-grpo", "--world", "tiny", "--task", "arithmetic", "--seed", str(seed)))
       for seed in (0, 1, 2)},
    **{f"grpo_arith_{level}_s{seed}": Run(("train-grpo", "--world", "tiny", "--task", "arithmetic", "--seed", str(seed)),
                                           env=(("ATEN_CPU_CAPABILITY", level),))
       for level in ("avx2", "default") for seed in (0, 1, 2)},
    # clip-higher against none, at the 100 phases the preset ran before issue 38
    "grpo_arith_100": Run(("train-grpo", "--world", "tiny", "--task", "arithmetic", "--seed", "0", "--num-phases", "100")),
    "grpo_arith_noclip": Run(("train-grpo", "--world", "tiny", "--task", "arithmetic", "--seed", "0",
                              "--clip-coef-high", "0.2", "--num-phases", "100")),
    "pass_at_k": Run(("pass-at-k", "--world", "tiny", "--samples", "64")),
    # the notebook's own run (its sizes and seeds, the reference functions): every figure of its summary
    "compare": Run(("compare-reasoning", "--world", "tiny", "--seed", "0")),
    # the shipped world rebuilt elsewhere (the shipped artifacts stay as they are)
    "arith_build": Run(("build-arith", "--out", "/tmp/rlhf_tutorial_figures/artifacts_arith")),
})

# Chapter 08: LoRA at ranks 1, 4, 16 against full fine-tuning. lora_rl and lora_sft are the notebook's runs
# (it runs ranks 0 and 1 of them and checks its numbers); lora_grpo_r1 is the README's acceptance command.
RUNS.update({
    "lora_grpo_r1": Run(("train-grpo", "--world", "tiny", "--seed", "0", "--lora-rank", "1", "--learning-rate", "3e-3")),
    "lora_rl": Run(("compare-lora", "--world", "tiny", "--task", "sentiment", "--seed", "0")),
    # the same runs at five seeds: the spread of each rank's final reward and KL (the notebook's band for rank 1)
    "lora_rl_seeds": Run(("compare-lora", "--world", "tiny", "--task", "sentiment", "--seeds", "0", "1", "2", "3", "4")),
    "lora_scan": Run(("compare-lora", "--world", "tiny", "--task", "sentiment", "--seed", "0", "--lr-multipliers", "1", "3",
                      "--num-phases", "12")),
    # a learning-rate scan over three seeds at the notebook's 20 phases, bracketing each rank's best rate: the LoRA
    # ranks at 0.3, 1 and 3 times 3e-3, full fine-tuning at 1, 3 and 10 times 3e-4
    "lora_scan_seeds": Run(("compare-lora", "--world", "tiny", "--task", "sentiment", "--ranks", "1", "4", "16",
                            "--seeds", "0", "1", "2", "--lr-multipliers", "0.3", "1", "3")),
    # the LoRA ranks at a tenth of 3e-3 too (the rate full fine-tuning does best at 1x to 3x of 3e-4), so that the scan
    # brackets rank 4's best from below as well
    "lora_scan_seeds_low": Run(("compare-lora", "--world", "tiny", "--task", "sentiment", "--ranks", "1", "4", "16",
                                "--seeds", "0", "1", "2", "--lr-multipliers", "0.1")),
    "lora_scan_seeds_full": Run(("compare-lora", "--world", "tiny", "--task", "sentiment", "--ranks", "0",
                                 "--seeds", "0", "1", "2", "--lr-multipliers", "1", "3", "10")),
    "lora_sft": Run(("compare-lora", "--world", "tiny", "--task", "arithmetic", "--seed", "0")),
    "lora_spectrum": Run(("compare-lora", "--world", "tiny", "--task", "spectrum")),
    # chapter 03's PPO with a rank-1 LoRA (the value head trains in full), at about 3x the preset's learning rate (10x, 7e-3, diverged)
    "lora_ppo_r1": Run(("train-rlhf", "--world", "tiny", "--seed", "0", "--lora-rank", "1", "--learning-rate", "2e-3")),
})

# Chapter 09: GRPO on multi-turn trajectories with the calculator; with a cost per call; the no-mask bug; the
# shipped calculator world rebuilt elsewhere (the shipped artifacts stay as they are).
RUNS.update({
    "agent_short": Run(("train-agent", "--world", "tiny", "--seed", "0")),
    # the same at seeds 1 and 2 (the text quotes the mean and spread: SPREADS["agent_short_seeds"])
    **{f"agent_short_s{seed}": Run(("train-agent", "--world", "tiny", "--seed", str(seed))) for seed in (1, 2)},
    "agent_cost": Run(("train-agent", "--world", "tiny", "--seed", "0", "--call-cost", "0.3")),
    "agent_nomask": Run(("train-agent", "--world", "tiny", "--seed", "0", "--no-policy-mask")),
    "calc_build": Run(("build-calc", "--out", "/tmp/rlhf_tutorial_figures/artifacts_calc")),
})

#: Runs whose figures swing with the seed, by name: the run of the same settings at several seeds whose summary
#: holds, under the same KEY, ``{"per_seed", "min", "max", "mean", "std"}`` (``compare-lora --seeds``). On another
#: CPU a run rounds differently from its first step, which is as good as another seed: :func:`disagreements` then
#: holds it to that measured spread (:func:`seed_band`) rather than to :func:`band` around the one recorded seed.
SEED_SPREADS: dict[str, str] = {
    # chapter 08: rank 1 at 3e-3 ends anywhere between about 0.6 and 0.9 by the seed (an H100 printed 0.618)
    "lora_rl": "lora_rl_seeds",
}

#: Runs whose summary is the spread over seeds of other recorded runs, by name: :class:`Spread`. Each seed is its own run
#: (its own process and record: a seed recorded stays when another has yet to be), and ``record-figures NAME`` writes
#: NAME from their records (:func:`spread_summary`), the summary ``train-grpo --task arithmetic --seeds`` prints.
@dataclass(frozen=True)
class Spread:
    """The spread of ``keys`` over the runs ``runs`` (one per seed, of the same settings)."""

    runs: tuple[str, ...]
    keys: tuple[str, ...]

    @property
    def command(self) -> str:
        return "record-figures: the spread over " + ", ".join(self.runs)


SPREADS: dict[str, Spread] = {
    # chapter 07 quotes the mean and spread of GRPO's pass@1 gain on arithmetic
    "grpo_arith": Spread(("grpo_arith_s0", "grpo_arith_s1", "grpo_arith_s2"),
                         ("pass_at_1_initial", "pass_at_1_final", "pass_at_1_gain", "wall_seconds", "cpu_seconds")),
    # chapter 09 quotes the mean and spread of train-agent's gain on the hard problems
    "agent_short_seeds": Spread(("agent_short", "agent_short_s1", "agent_short_s2"),
                          ("accuracy_initial", "accuracy_final", "accuracy_gain", "tool_calls_per_problem_initial",
                           "tool_calls_per_problem_final", "wall_seconds", "cpu_seconds")),
    # and at the two other kernel levels (the README's table)
    **{f"grpo_arith_{level}": Spread(tuple(f"grpo_arith_{level}_s{seed}" for seed in (0, 1, 2)),
                                     ("pass_at_1_initial", "pass_at_1_final", "pass_at_1_gain", "wall_seconds",
                                      "cpu_seconds"))
       for level in ("avx2", "default")},
}

#: Summary entries not worth keeping (every sample's text: long; the few `samples_*` are kept).
DROPPED_KEYS = ("texts",)

_PLACEHOLDER = re.compile(r"\{\{([a-z0-9_]+)\.([A-Za-z0-9_.\-]+?)(?::([^{}]+))?\}\}")
_README_FIGURE = re.compile(
    r"(?P<num>[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?)(?P<tag><!--fig (?P<ref>[a-z0-9_]+\.[A-Za-z0-9_.\-]+)-->)")


# ----------------------------------------------------------------------------------------------------
# Reading recorded figures
# ----------------------------------------------------------------------------------------------------


def recorded(path: Path = FIGURES_FILE) -> dict[str, Any]:
    """Every recorded run: ``{name: {"command", "summary", "recorded", "machine"}}``."""
    return json.loads(path.read_text()) if path.exists() else {}


def lookup(ref: str, figures: dict[str, Any] | None = None) -> Any:
    """The recorded value of ``"NAME.KEY"`` (KEY may descend into dicts and lists: ``a.b``, ``a.-1``; a dict key
    that holds a dot itself, a learning-rate multiplier ``"0.3"``, is found whole, before a key "0":
    ``scan.1.0.3.kl_final``)."""
    figures = recorded() if figures is None else figures
    name, _, key = ref.partition(".")
    if name not in figures:
        known = ", ".join(sorted(figures)) or "none yet"
        raise KeyError(f"figure {ref!r}: no recorded run {name!r} (recorded: {known}); add it to figures.RUNS and "
                       f"run `python -m rlhf_tutorial record-figures {name}`")
    value: Any = figures[name]["summary"]
    parts = key.split(".")
    while parts:
        part = parts.pop(0)
        if isinstance(value, dict) and parts and f"{part}.{parts[0]}" in value:  # the longer key first
            part = f"{part}.{parts.pop(0)}"
        try:
            value = value[int(part)] if isinstance(value, list) else value[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise KeyError(f"figure {ref!r}: the summary of {figures[name]['command']!r} has no {key!r}") from None
    return value


def fmt(value: Any, spec: str | None) -> str:
    """``value`` as the prose shows it: ``spec`` is a format spec (``.2f``, ``,.0f``); without one, floats
    get 2 decimals and everything else ``str``."""
    if spec:
        return format(value, spec)
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def substitute(text: str, figures: dict[str, Any] | None = None) -> str:
    """``text`` with every ``{{NAME.KEY[:FORMAT]}}`` replaced by the recorded value."""
    figures = recorded() if figures is None else figures
    return _PLACEHOLDER.sub(lambda m: fmt(lookup(f"{m[1]}.{m[2]}", figures), m[3]), text)


def placeholders(text: str) -> list[str]:
    """Every ``NAME.KEY`` that ``text`` quotes (course placeholders and README tags)."""
    return [f"{m[1]}.{m[2]}" for m in _PLACEHOLDER.finditer(text)] + [m["ref"] for m in _README_FIGURE.finditer(text)]


def sync_readme(text: str, figures: dict[str, Any] | None = None) -> str:
    """``text`` with the number before every ``<!--fig NAME.KEY-->`` rewritten to the recorded value, with
    as many decimals (and the explicit ``+``, and the scientific form ``5.7e-6``) it had."""
    figures = recorded() if figures is None else figures

    def one(m: re.Match) -> str:
        mantissa, e, _ = m["num"].partition("e")
        decimals = len(mantissa.partition(".")[2])
        sign = "+" if m["num"].startswith("+") else ""  # an explicit sign stays
        value = float(lookup(m["ref"], figures))
        if e:  # scientific, written as 5.7e-6 (not Python's 5.7e-06)
            return re.sub(r"e([-+])0*(\d)", r"e\1\2", f"{value:{sign}.{decimals}e}").replace("e+", "e") + m["tag"]
        return f"{value:{sign}.{decimals}f}{m['tag']}"

    return _README_FIGURE.sub(one, text)


# ----------------------------------------------------------------------------------------------------
# A notebook's own run against the text
# ----------------------------------------------------------------------------------------------------


def same_machine(recorded_on: dict[str, Any], here: dict[str, Any] | None = None) -> bool:
    """Whether this process computes as the run's recording did: the same CPU model, kernel level, kernel
    environment variables and torch build (then the same seed gives the same run, up to thread counts)."""
    from rlhf_tutorial.buildinfo import build_info

    here = build_info() if here is None else here

    def fingerprint(info: dict[str, Any]) -> tuple:
        torch_build = info.get("torch_build", {})
        return (info.get("cpu"), torch_build.get("cpu_capability"), torch_build.get("version"),
                tuple(sorted(info.get("kernel_env", {}).items())))

    return fingerprint(recorded_on) == fingerprint(here)


def band(key: str, same: bool = True) -> tuple[float, float]:
    """How far a run may land from the recorded figure, as (absolute, relative) tolerance; a value agrees
    when within either. ``same``: on a machine like the recording's (:func:`same_machine`) a run repeats
    up to thread-count rounding, so the bands are tight enough to catch a stale figure (a reward off by
    more than 0.05, a KL by more than 40%). On another CPU an RL run rounds differently from its first
    step and ends elsewhere: chapter 05's ``REBUILD_BANDS`` saw one run's KL range over 0.24-0.34 at
    four kernel levels, and a reward measured on 64 samples has a standard error near 0.06; there the
    bands are the wider ones below. Times and memory are never compared."""
    if "seconds" in key or "memory" in key:
        return math.inf, math.inf
    if "kl" in key:
        return (0.03, 0.4) if same else (0.1, 0.75)
    if "reward" in key or "accuracy" in key or "pass_at" in key:
        return (0.05, 0.0) if same else (0.2, 0.0)
    return (0.0, 0.3) if same else (0.0, 0.6)


def seed_band(spread: dict[str, Any]) -> tuple[float, float]:
    """The values a run of other seeds (or another CPU) may end at, from a spread over seeds
    (``{"min", "max", "std"}``): ``[min - std, max + std]``. The range of n draws alone misses the next one with
    probability 2 / (n + 1) (a third at five seeds); one standard deviation either side of five normal draws'
    range (about mean +- 2.2 std) misses it about 3% of the time."""
    lo, hi, std = float(spread["min"]), float(spread["max"]), float(spread["std"])
    return lo - std, hi + std


def disagreements(name: str, observed: dict[str, float], figures: dict[str, Any] | None = None,
                  same: bool = True) -> list[str]:
    """One line per entry of ``observed`` (``{KEY: value this run printed}``) outside :func:`band` of the
    recorded ``NAME.KEY``; on another CPU (``same`` False) a KEY that ``SEED_SPREADS[NAME]`` measured over seeds
    agrees within :func:`seed_band` of that spread or within :func:`band`."""
    figures = recorded() if figures is None else figures
    out = []
    spread_run = SEED_SPREADS.get(name)
    for key, value in observed.items():
        want = float(lookup(f"{name}.{key}", figures))
        abs_tol, rel_tol = band(key, same)
        if abs(value - want) <= abs_tol or abs(value - want) <= rel_tol * abs(want):
            continue
        spread = None
        if not same and spread_run and spread_run in figures and "seconds" not in key and "memory" not in key:
            try:
                spread = lookup(f"{spread_run}.{key}", figures)
            except KeyError:  # a key the seeds did not measure keeps band()
                pass
        if spread is None:
            out.append(f"{key}: this run {value:.4g}, the text {want:.4g} (tolerance ±{abs_tol:g} or ±{rel_tol:.0%})")
            continue
        lo, hi = seed_band(spread)
        if not lo <= value <= hi:
            out.append(f"{key}: this run {value:.4g}, the text {want:.4g}; over seeds {spread['per_seed']} "
                       f"({spread_run}) a run lands within {lo:.4g} to {hi:.4g} (their range ± one standard deviation)")
    return out


def agree(name: str, observed: dict[str, float], world: str | None = None, smoke: bool | None = None) -> bool:
    """Check that what a notebook's run printed agrees with what its text quotes from run ``name``.

    Only in the run's world and at full size (the GPT-2 world's figures are not the tiny world's, and a
    smoke run proves the code path, not the numbers), with :func:`band`'s tight tolerances on a machine
    like the recording's and wide ones elsewhere. Under ``RLHF_TUTORIAL_STRICT=1`` (nbval in CI) a
    disagreement raises ``AssertionError``; otherwise it prints what differs and returns False.
    """
    from rlhf_tutorial.worlds import is_smoke, resolve_world

    run = RUNS[name]
    world = resolve_world(world)
    smoke = is_smoke() if smoke is None else smoke
    if world != run.world or smoke:
        return True
    machine = recorded()[name]["machine"]
    same = same_machine(machine)
    problems = disagreements(name, observed, same=same)
    if not problems:
        return True
    where = f"{machine.get('cpu', '?')}, {machine.get('torch_build', {}).get('cpu_capability', '?')}"
    message = (f"The text quotes `{run.command}` as recorded on the reference machine ({where}; this machine "
               f"{'computes like it' if same else 'rounds differently'}); this run differs:\n  " + "\n  ".join(problems))
    if os.environ.get("RLHF_TUTORIAL_STRICT") == "1":
        raise AssertionError(message + "\nRe-record with `python -m rlhf_tutorial record-figures "
                             f"{name}` and rebuild the notebooks if the code changed on purpose.")
    print(message + "\n(A large gap usually means an exercise differs from the reference.)")
    return False


# ----------------------------------------------------------------------------------------------------
# Recording
# ----------------------------------------------------------------------------------------------------


def run_summary(run: Run) -> dict[str, Any]:
    """Run ``run`` in a fresh process and return its last-line JSON summary (less :data:`DROPPED_KEYS`)."""
    proc = subprocess.run([sys.executable, "-m", "rlhf_tutorial", *run.argv], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **dict(run.env)})
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"`{run.command}` failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads(lines[-1])
    return {k: v for k, v in summary.items() if k not in DROPPED_KEYS}


def machine_info(run: Run) -> dict[str, Any]:
    """:func:`rlhf_tutorial.buildinfo.build_info` as ``run``'s process sees it: under its ``env`` (another kernel
    level, say) asked of a fresh process, since this one's torch has already chosen its kernels."""
    from rlhf_tutorial.buildinfo import build_info

    if not run.env:
        return build_info()
    code = "import json; from rlhf_tutorial.buildinfo import build_info; print(json.dumps(build_info()))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, **dict(run.env)})
    return json.loads(proc.stdout.strip().splitlines()[-1])


def spread_summary(spread: Spread, figures: dict[str, Any]) -> dict[str, Any]:
    """The summary of a :class:`Spread` from the recorded runs it names: ``seeds`` (each run's seed, in order),
    ``n_seeds``, ``runs`` (their names) and, per key, ``over_seeds[key]`` = ``{"per_seed", "min", "max", "mean",
    "std"}`` (``trainers.grpo.spread``: the sample standard deviation). Raises KeyError naming a run not recorded."""
    from rlhf_tutorial.trainers.grpo import spread as spread_of

    missing = [n for n in spread.runs if n not in figures]
    if missing:
        raise KeyError(f"the spread needs the runs {', '.join(missing)} recorded first: record-figures {' '.join(missing)}")
    summaries = [figures[n]["summary"] for n in spread.runs]
    return {"seeds": [s["seed"] for s in summaries], "n_seeds": len(summaries), "runs": list(spread.runs),
            "over_seeds": {key: spread_of([s[key] for s in summaries]) for key in spread.keys}}


def record(names: list[str], path: Path = FIGURES_FILE) -> dict[str, Any]:
    """Run each named run (every one of :data:`RUNS` when ``names`` is empty) and store its summary; a name of
    :data:`SPREADS` is written from its runs' records (after the runs named with it)."""
    unknown = [n for n in names if n not in RUNS and n not in SPREADS]
    if unknown:
        raise SystemExit(f"record-figures: unknown run(s) {', '.join(unknown)}; known: {', '.join([*RUNS, *SPREADS])}")
    for name in [n for n in names if n in RUNS] if names else list(RUNS):
        run = RUNS[name]
        print(f"[record-figures] {name}: {run.command}", file=sys.stderr, flush=True)
        entry = {"command": run.command, "summary": run_summary(run),
                 "recorded": datetime.date.today().isoformat(), "machine": machine_info(run)}
        figures = {**recorded(path), name: entry}  # read again: another recording may have added runs
        path.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")  # after each run: nothing lost
    for name in [n for n in names if n in SPREADS] if names else list(SPREADS):
        figures = recorded(path)
        spread = SPREADS[name]
        print(f"[record-figures] {name}: {spread.command}", file=sys.stderr, flush=True)
        entry = {"command": spread.command, "summary": spread_summary(spread, figures),
                 "recorded": datetime.date.today().isoformat(), "machine": figures[spread.runs[0]]["machine"]}
        path.write_text(json.dumps({**figures, name: entry}, indent=1, sort_keys=True) + "\n")
    return recorded(path)


def main(argv: list[str]) -> dict:
    """``record-figures [NAME ...]``: re-run the quoted runs, store their summaries, update the README."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m rlhf_tutorial record-figures", description=main.__doc__)
    parser.add_argument("names", nargs="*", help=f"runs to record (default: all): {', '.join([*RUNS, *SPREADS])}")
    parser.add_argument("--list", action="store_true", help="list the runs and where each is recorded, run nothing")
    ns = parser.parse_args(argv)
    if ns.list:
        figures = recorded()
        return {"runs": {n: {"command": r.command, "recorded": figures.get(n, {}).get("recorded")}
                         for n, r in {**RUNS, **SPREADS}.items()}}
    figures = record(ns.names)
    README.write_text(sync_readme(README.read_text(), figures))
    return {"recorded": ns.names or [*RUNS, *SPREADS], "file": str(FIGURES_FILE),
            "next": "python -m rlhf_tutorial build-notebooks"}
