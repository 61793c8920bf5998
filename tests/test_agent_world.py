"""Chapter 09's world and trainer: the calculator world's problems and pretraining text, the shipped
base model (tool use rare, hard problems failed in the head), its rebuild, and ``train-agent`` at smoke
size (the learner's functions plugged in, the mask, determinism, the summary's keys)."""

from __future__ import annotations

import copy
import json
import random
import re

import pytest
import torch

from rlhf_tutorial import agent, figures
from rlhf_tutorial.tiny import build_calc, calc
from rlhf_tutorial.trainers import agent as run


# --- the generator ------------------------------------------------------------------------------------------
def test_problems_have_their_difficultys_shape_and_are_seeded():
    for d in calc.DIFFICULTIES:
        ops, digits = calc.LEVELS[d]
        ps = calc.problems(200, seed=3, difficulty=d)
        assert ps == calc.problems(200, seed=3, difficulty=d)
        assert ps != calc.problems(200, seed=4, difficulty=d)
        assert {p.op for p in ps} == set(ops)
        for p in ps:
            assert p.difficulty == d and len(str(p.a)) == digits and len(str(p.b)) == digits
            assert p.answer == {"+": p.a + p.b, "-": p.a - p.b, "*": p.a * p.b}[p.op]
            assert calc.parse_prompt(p.prompt + p.solution(tool=True)) == p
    assert calc.parse_prompt("hello") is None
    with pytest.raises(ValueError, match="difficulty"):
        calc.problems(3, seed=0, difficulty="impossible")


def test_the_worlds_tool_syntax_is_the_environments():
    """The pretraining text writes the call and the result exactly as chapter 09's environment does."""
    assert (calc.CALL_OPEN, calc.CALL_CLOSE, calc.RESULT_PREFIX) == (agent.CALL_OPEN, agent.CALL_CLOSE,
                                                                      agent.RESULT_PREFIX)
    for p in calc.problems(50, seed=1, difficulty="hard") + calc.problems(50, seed=1, difficulty="medium"):
        text = p.solution(tool=True)
        call_end = text.index(calc.CALL_CLOSE) + len(calc.CALL_CLOSE)
        assert agent.parse_tool_call(text[:call_end]) == p.expression
        assert text[call_end:].startswith(agent.calculator(text[:call_end]) + "\n")
        assert p.solution(tool=False) == f"{p.expression}{agent.RESULT_PREFIX}{p.answer}\nAnswer: {p.answer}"


def test_head_mistakes_are_wrong_and_plausible():
    rng = random.Random(0)
    for d in calc.DIFFICULTIES:
        for p in calc.problems(300, seed=2, difficulty=d):
            wrong = calc.head_mistake(rng, p)
            assert wrong != p.answer
            assert abs(wrong - p.answer) <= 1000


def test_corpus_calls_the_tool_rarely_and_the_head_fails_more_on_harder_problems():
    writer = calc.CalcWriter()
    texts = calc.corpus(6000, seed=5, writer=writer)
    assert texts == calc.corpus(6000, seed=5, writer=writer)
    calls, wrong, seen = {}, {}, {}
    for t in texts:
        problem = calc.parse_prompt(t)
        d = problem.difficulty
        seen[d] = seen.get(d, 0) + 1
        answer = int(re.fullmatch(r"(?s).*\nAnswer: (-?[0-9]+)", t).group(1))
        if calc.CALL_OPEN in t:
            calls[d] = calls.get(d, 0) + 1
            assert answer == problem.answer  # an answer read off the calculator is right
        else:
            wrong[d] = wrong.get(d, 0) + (answer != problem.answer)
    assert set(seen) == set(calc.DIFFICULTIES)
    for d in calc.DIFFICULTIES:
        assert abs(calls[d] / seen[d] - writer.tool_rate) < 0.03, d  # rare, and as rare at every difficulty
        assert abs(wrong[d] / (seen[d] - calls[d]) - writer.head_error[d]) < 0.05, d
    assert writer.head_error["easy"] < writer.head_error["medium"] < writer.head_error["hard"]


# --- the shipped world --------------------------------------------------------------------------------------
def test_shipped_calc_world_manifest_and_metadata():
    folder = build_calc.ARTIFACTS
    manifest = json.loads((folder / "manifest.json").read_text())
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(manifest) == on_disk
    from rlhf_tutorial.tiny.build import sha256

    assert all(sha256(folder / name) == digest for name, digest in manifest.items())
    assert sum((folder / name).stat().st_size for name in manifest) < 5_000_000
    meta = json.loads((folder / "metadata.json").read_text())
    assert meta["build_args"] == {k: v for k, v in vars(build_calc.CalcBuildArgs()).items() if k != "out"}
    arith_config = json.loads((build_calc.ARTIFACTS.parent / "artifacts_arith" / "policy" / "config.json").read_text())
    config = json.loads((folder / "policy" / "config.json").read_text())
    assert config["d_model"] <= arith_config["d_model"] and config["n_layers"] <= arith_config["n_layers"]
    # no bound on meta["build_seconds"]: the shipped build ran at nice 19 on a loaded 2-core machine (6 min wall,
    # about 5 min of CPU); its wall time says how busy the machine was


@pytest.fixture(scope="module")
def base_model():
    from rlhf_tutorial.worlds import load_agent_policy

    return load_agent_policy("tiny")


def test_shipped_base_model_has_tool_use_as_a_rare_behaviour(base_model):
    """The room RL needs, measured on problems the build never measured: easy problems solved in the head,
    hard ones mostly failed; the tool called now and then, and a call's result copied into the answer."""
    args = run.AgentArgs(world="tiny", seed=7, eval_problems=48, eval_samples=4)
    result = run.evaluate(base_model, args)
    assert result == run.evaluate(base_model, args)
    assert result["easy"]["accuracy"] >= 0.7  # the shipped build measured 0.95 (seed 0 of the measure split)
    assert result["easy"]["accuracy"] > result["hard"]["accuracy"] + 0.15
    assert result["hard"]["accuracy"] <= 0.35
    assert 0.02 <= result["hard"]["call_rate"] <= 0.35
    assert result["hard"]["calls_per_problem"] <= 0.4
    # when it calls, it copies the problem into the call and the result into the answer: a call pays
    assert result["hard"]["accuracy_with_call"] >= 0.8 > 0.3 >= result["hard"]["accuracy_without_call"]


def test_shipped_base_model_copies_the_calculators_result(base_model):
    """What RL cannot teach in a few phases and the world must: once the calculator has written a 3- or 4-digit
    result, the base model's answer line (greedy) is that result."""
    right = 0
    problem_list = calc.problems(40, seed=9, difficulty="hard")
    for p in problem_list:
        text = p.prompt + p.solution(tool=True)
        prefix = text[: text.index("\nAnswer: ") + len("\nAnswer:")]
        tokens = base_model.to_tokens(prefix)
        out = base_model.generate(tokens, max_new_tokens=7, do_sample=False, verbose=False, stop_at_eos=True)
        right += base_model.tokenizer.decode(out[0, tokens.shape[1]:]).replace("<|endoftext|>", "").strip() == str(p.answer)
    assert right >= 0.9 * len(problem_list)


def test_the_environments_tokens_are_the_pretraining_texts_tokens(base_model):
    """Appending the calculator's text as its own ids gives the ids the base model was trained on."""
    encode, _ = run.tokenizer_fns(base_model)
    for p in calc.problems(30, seed=0, difficulty="hard"):
        text = p.solution(tool=True)
        i, j = text.index(calc.CALL_CLOSE) + len(calc.CALL_CLOSE), text.index("\nAnswer")
        assert encode(text) == encode(text[:i]) + encode(text[i:j]) + encode(text[j:])


SMALL_BUILD = dict(n_train=300, n_val=20, policy_epochs=1, eval_problems=4, eval_samples=2, d_model=32, d_mlp=64)


@pytest.mark.slow
def test_build_calc_is_deterministic(tmp_path):
    manifests = []
    for name in ("a", "b"):
        summary = build_calc.build(build_calc.CalcBuildArgs(out=str(tmp_path / name), **SMALL_BUILD))
        assert summary["n_files"] == 5
        manifest = json.loads((tmp_path / name / "manifest.json").read_text())
        manifest.pop("metadata.json")
        manifests.append(manifest)
    assert manifests[0] == manifests[1]


def test_the_shipped_world_is_what_the_build_makes_short_of_its_training(tmp_path):
    """Every step of ``build-calc`` but the policy's 5 minutes of training, redone from the shipped build's
    arguments: the corpus (its statistics and first text), the tokenizer (the same bytes), the policy's
    config, and the base model's measurement (to float rounding on other kernels). The training step is
    covered by the recorded full rebuild (next test) and by the small builds' determinism (above)."""
    from rlhf_tutorial.tiny.build import policy_config, sha256, sub_seed, train_bpe_tokenizer

    folder = build_calc.ARTIFACTS
    meta = json.loads((folder / "metadata.json").read_text())
    manifest = json.loads((folder / "manifest.json").read_text())
    args = build_calc.CalcBuildArgs(**meta["build_args"])
    texts = calc.corpus(args.n_train, sub_seed(args.seed, "calc-train"), args.writer())
    assert texts[0] == meta["corpus"]["example"]
    assert round(sum(calc.CALL_OPEN in t for t in texts) / len(texts), 4) == meta["corpus"]["tool_solutions"]
    bpe = train_bpe_tokenizer(texts, args.bpe_vocab, tmp_path / "tokenizer", split_digits=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert sha256(tmp_path / "tokenizer" / name) == manifest[f"tokenizer/{name}"], name
    config = json.loads((folder / "policy" / "config.json").read_text())
    assert {**policy_config(args, len(bpe)), "model_name": "tiny-calculator-gpt2"}.items() <= config.items()
    from rlhf_tutorial.worlds import _load_tiny_policy

    measured = build_calc.measure(_load_tiny_policy(folder, "cpu"), sub_seed(args.seed, "calc-measure") % 10_000,
                                  args.eval_problems, args.eval_samples)
    for d in calc.DIFFICULTIES:
        for key in ("accuracy", "calls_per_problem"):
            assert abs(measured[d][key] - meta["base_with_tool"][d][key]) <= 0.03, (d, key)


def test_the_recorded_full_rebuild_made_the_shipped_files():
    """``record-figures calc_build`` reran the whole build from seed 0 (5 minutes) with today's code: on
    the shipping machine's kernels it wrote the shipped files, byte for byte."""
    record = figures.recorded()["calc_build"]
    manifest = json.loads((build_calc.ARTIFACTS / "manifest.json").read_text())
    meta = json.loads((build_calc.ARTIFACTS / "metadata.json").read_text())
    assert record["machine"]["torch_build"]["cpu_capability"] == meta["build_info"]["torch_build"]["cpu_capability"]
    assert record["summary"]["sha256"] == {k: v for k, v in manifest.items() if k != "metadata.json"}
    assert record["summary"]["val_loss"] == round(meta["policy"]["val_loss"], 4)


# --- the trainer (smoke sizes) ------------------------------------------------------------------------------
SMOKE = dict(num_phases=2, problems_per_difficulty=2, group_size=4, eval_problems=4, eval_samples=2)


def test_train_agent_is_deterministic_and_runs_the_learners_functions(base_model):
    args = run.AgentArgs.preset("tiny", seed=0, **SMOKE)
    a = run.train_agent(args, policy=copy.deepcopy(base_model), progress=False)
    b = run.train_agent(args, policy=copy.deepcopy(base_model), progress=False)
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in a.history]
    assert strip == [{k: v for k, v in r.items() if k != "seconds"} for r in b.history]
    assert a.eval_final == b.eval_final
    for x, y in zip(a.policy.parameters(), b.policy.parameters()):
        assert torch.equal(x, y)
    assert len(a.history) == 2

    seen = {"mask": [], "reward": 0, "tool": 0}

    def policy_token_mask(tokens, prompt_len, env_spans, lengths):
        out = agent.policy_token_mask(tokens, prompt_len, env_spans, lengths)
        seen["mask"].append((out.clone(), env_spans))
        return out

    def agent_reward(correct, num_calls, call_cost=0.0):
        seen["reward"] += 1
        return agent.agent_reward(correct, num_calls, call_cost)

    def safe_calculate(expression):
        seen["tool"] += 1
        return agent.safe_calculate(expression)

    run.train_agent(args, policy=copy.deepcopy(base_model), progress=False, evaluate_before_after=False,
                    policy_token_mask=policy_token_mask, agent_reward=agent_reward, safe_calculate=safe_calculate)
    assert seen["reward"] == 2 * 3  # a phase scores each difficulty's rollout once (each of one prompt length)
    assert len(seen["mask"]) == 2 * 3  # the reference rollout builds its mask with the learner's function
    assert seen["tool"] == sum(len(s) for _, spans in seen["mask"] for s in spans)
    with pytest.raises(TypeError):
        run.train_agent(args, policy=copy.deepcopy(base_model), progress=False, not_an_exercise=agent_reward)


def test_the_mask_trains_only_the_policys_tokens_unless_the_bug_is_asked_for(base_model):
    args = run.AgentArgs.preset("tiny", seed=0, **SMOKE)
    fns = run.bind(agent, run.AGENT_PLUGGABLE, {})
    problem_list = calc.problems(4, seed=0, difficulty="hard")
    # a policy that always calls: the base model steered by forcing the call's first tokens is overkill
    # here; the rollout of the base model with many samples has calls
    generator = torch.Generator(device=next(base_model.parameters()).device).manual_seed(0)
    rollouts = run.rollout_problems(base_model, problem_list, 16, args, fns, generator)
    (_, rollout), = rollouts
    assert rollout.num_calls.sum() > 0
    masked, unmasked = run.trained_mask(rollout, True), run.trained_mask(rollout, False)
    assert torch.equal(masked, rollout.mask)
    for i, spans in enumerate(rollout.env_spans):
        for start, end in spans:
            assert not masked[i, start:end].any() and unmasked[i, start:end].all()
    assert torch.equal(unmasked & ~masked, unmasked ^ masked)  # the bug adds exactly the environment's tokens
    assert (unmasked ^ masked).sum() == sum(e - s for spans in rollout.env_spans for s, e in spans)


def test_self_written_results_are_counted_and_checked():
    assert run.self_written_results(["<calc>12*3</calc>"]) == (0, 0)
    assert run.self_written_results(["<calc>12*3 = 36\nAnswer: 36"]) == (1, 0)
    assert run.self_written_results(["12*3=35\nAnswer: 35", "\nAnswer: 36"]) == (1, 1)


def test_cli_summary_has_the_keys_the_tooling_reads(monkeypatch, base_model):
    from rlhf_tutorial import worlds

    monkeypatch.setattr(worlds, "load_agent_policy", lambda world=None, **_: copy.deepcopy(base_model))
    argv = ["--world", "tiny", "--seed", "0", "--no-progress", "--call-cost", "0.1"]
    argv += [f"--{k.replace('_', '-')}={v}" for k, v in SMOKE.items()]
    summary = run.main(argv)
    json.dumps(summary)
    for key in ("accuracy_initial", "accuracy_final", "tool_calls_per_problem_initial",
                "tool_calls_per_problem_final", "wall_seconds", "cpu_seconds"):
        assert isinstance(summary[key], float), key
    assert set(summary["by_difficulty"]) == set(calc.DIFFICULTIES)
    for d, row in summary["by_difficulty"].items():
        for key in ("accuracy", "calls_per_problem"):
            assert {f"{key}_initial", f"{key}_final"} <= set(row), d
    assert summary["by_difficulty"]["hard"]["accuracy_final"] == summary["accuracy_final"]
    assert summary["accuracy_gain"] == pytest.approx(summary["accuracy_final"] - summary["accuracy_initial"], abs=2e-4)
    assert summary["args"]["call_cost"] == 0.1 and summary["phases"] == 2
    timings = ("wall_seconds", "cpu_seconds")
    again = run.main(argv)  # deterministic for a seed: the same summary but for the timings
    assert {k: v for k, v in again.items() if k not in timings} == {k: v for k, v in summary.items() if k not in timings}
    nomask = run.main(argv + ["--no-policy-mask"])
    assert nomask["policy_mask"] is False
    for row in nomask["by_difficulty"].values():  # what the no-mask ablation reports: results written without a call
        for key in ("self_results_per_problem", "self_results_wrong", "accuracy_without_call", "accuracy_with_call"):
            assert {f"{key}_initial", f"{key}_final"} <= set(row)


def test_gpt2_preset_differs_and_keeps_every_field():
    tiny, gpt2 = run.AgentArgs.preset("tiny"), run.AgentArgs.preset("gpt2")
    assert tiny != gpt2 and gpt2.world == "gpt2"
    assert set(run.PRESETS["gpt2"]) <= set(vars(tiny))


def test_train_agent_runs_in_the_gpt2_world(gpt2_world):
    """The GPT-2 world's code path on the stand-in cache (random weights: it runs, nothing is learned):
    the fine-tuning on the corpus, GPT-2's tokenizer in the rollout, the preset where no flag is given."""
    argv = ["--world", "gpt2", "--seed", "0", "--no-progress", "--sft-texts", "16", "--num-phases", "1",
            "--problems-per-difficulty", "1", "--group-size", "2", "--eval-problems", "2", "--eval-samples", "1",
            "--max-new-tokens", "6", "--difficulties", "hard"]
    summary = run.main(argv)
    assert summary["world"] == "gpt2" and summary["phases"] == 1
    assert summary["args"]["learning_rate"] == run.PRESETS["gpt2"]["learning_rate"]
    assert set(summary["by_difficulty"]) == set(calc.DIFFICULTIES)


def test_every_minibatchs_ratio_is_against_the_policy_that_sampled(base_model):
    """The "old" log-probs are computed once per phase, before any step: the first minibatch's ratios are 1,
    a later minibatch's are not (the step before it moved the policy), so clipping can act. Recomputing
    them before each minibatch would leave every ratio at 1."""
    from rlhf_tutorial import grpo

    gaps = []

    def spy(new, old, ref, advantages, mask, **kw):
        gaps.append((new.detach() - old)[mask].abs().max().item())
        return grpo.calc_grpo_objective(new, old, ref, advantages, mask, **kw)

    args = run.AgentArgs(world="tiny", num_phases=1, problems_per_difficulty=4, group_size=8, updates_per_phase=2,
                         learning_rate=1e-2, difficulties="medium,hard")
    run.train_agent(args, policy=copy.deepcopy(base_model), progress=False, evaluate_before_after=False,
                    calc_grpo_objective=spy)
    first_update = gaps[: len(gaps) // 2]  # one call per rollout batch (a prompt length) in each minibatch
    assert max(first_update) < 1e-4, gaps
    assert max(gaps) > 1e-3, gaps
