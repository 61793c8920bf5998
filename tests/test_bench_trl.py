"""bench-trl: a smoke-sized race of our GRPO against TRL's GRPOTrainer (TRL is the `trl` extra, which
`make test` installs). The figures that matter come from the full CLI run; this checks that both sides
run on the same exported model and settings and that the summary reports what the issue asks for."""

from __future__ import annotations

import pytest

from rlhf_tutorial.speed import SECTIONS
from rlhf_tutorial.trainers import grpo

trl = pytest.importorskip("trl", reason="the `trl` extra is not installed (make test installs it)")

from rlhf_tutorial.trainers import bench_trl  # noqa: E402


def test_settings_map_onto_a_grpo_config(tmp_path):
    args = grpo.GRPOArgs.preset("tiny")
    config = bench_trl.trl_config(args, seed=3, out=str(tmp_path))
    rows = args.groups_per_phase * args.group_size
    assert config.per_device_train_batch_size * config.steps_per_generation == rows
    assert config.num_generations == args.group_size and config.num_iterations == args.update_epochs
    assert config.max_steps == args.num_phases * args.num_minibatches * args.update_epochs
    assert (config.beta, config.epsilon, config.loss_type, config.max_completion_length) == (
        args.kl_coef, args.clip_coef, args.loss_type, args.max_new_tokens)
    assert config.lr_scheduler_type == "constant" and config.learning_rate == args.learning_rate
    assert config.seed == 3


def test_smoke_race_reports_both_sides():
    summary = bench_trl.main(["--algo", "grpo", "--smoke", "--seeds", "0"])
    assert summary["trl_version"] == trl.__version__
    for side in ("ours", "trl"):
        (run,) = summary["runs"][side]
        assert run["phases"] == 2 and len(run["reward_per_phase"]) == 2
        assert set(run["seconds_per_phase_split"]) == set(SECTIONS)
        assert run["seconds_per_phase"] > 0 and run["peak_memory_mb"] == run["peak_memory_mb"]  # not NaN
        assert 0.0 <= run["final_reward"] <= 1.0
    # ours keeps the sampler's log-probs (no old-policy forward: at most a device copy of them); TRL runs one
    ours_old = summary["runs"]["ours"][0]["seconds_per_phase_split"]["old_logprobs"]
    trl_old = summary["runs"]["trl"][0]["seconds_per_phase_split"]["old_logprobs"]
    assert trl_old > 0.0 and ours_old <= 0.25 * trl_old
    assert set(summary["ratio_ours_over_trl"]) == {"seconds_to_target", "seconds_per_phase", "peak_memory_mb",
                                                   "process_peak_mb"}
    assert summary["trl_differences"] and "one process" in summary["memory_counted"]


# ----------------------------------------------------------------------------------------------------
# --algo dpo: our DPO trainer (chapter 06) against TRL's DPOTrainer
# ----------------------------------------------------------------------------------------------------


def test_dpo_settings_map_onto_a_dpo_config(tmp_path):
    from rlhf_tutorial.trainers import bench_trl_dpo, dpo

    args = dpo.DPOArgs.preset("tiny", epochs=2)
    config = bench_trl_dpo.trl_config(args, seed=3, out=str(tmp_path), max_prompt_tokens=5)
    assert (config.beta, config.learning_rate, config.per_device_train_batch_size, config.max_grad_norm) == (
        args.beta, args.learning_rate, args.batch_size, args.max_grad_norm)
    assert config.num_train_epochs == args.rounds * args.epochs and config.gradient_accumulation_steps == 1
    assert config.loss_type == ["sigmoid"] and config.lr_scheduler_type == "constant"
    assert config.warmup_steps == 0 and config.weight_decay == 0.0
    assert config.precompute_ref_log_probs and not config.bf16 and not config.gradient_checkpointing
    assert config.max_length == 5 + args.max_new_tokens  # cuts TRL's extra EOS off completions at the limit
    assert config.seed == 3 and config.report_to == [] and config.save_strategy == "no"


def test_dpo_trl_reads_the_same_token_ids_as_ours(tmp_path):
    """TRL tokenizes our pairs' strings to our token ids, for completions that stopped at EOS and for
    those cut off at max_new_tokens (TRL appends an EOS that max_length cuts off again)."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOTrainer

    from rlhf_tutorial.rewards import sentiment_reward_fn
    from rlhf_tutorial.trainers import bench_trl_dpo, dpo
    from rlhf_tutorial.trainers.export import export_hf, load_hf_policy
    from rlhf_tutorial.worlds import load_policy

    args = dpo.DPOArgs.preset("tiny", **bench_trl_dpo.SMOKE)
    base = load_policy("tiny", device="cpu")
    pairs, _ = bench_trl_dpo.draw_pairs(args, base, sentiment_reward_fn("tiny", args.direction), seed=0)
    eos = base.tokenizer.eos_token_id
    # a completion that stopped at EOS (8 sampled tokens rarely do), padded as sample_group pads
    text = args.prompts[0] + " bad"
    ids = torch.cat([base.to_tokens(text)[0], torch.tensor([eos])])
    plen = base.to_tokens(args.prompts[0]).shape[1]
    width = plen + args.max_new_tokens
    tokens = torch.nn.functional.pad(ids, (0, width - len(ids)), value=eos)
    mask = (torch.arange(width) >= plen) & (torch.arange(width) < len(ids))
    pairs = [(tokens, mask, *pairs[0][2:4], text, pairs[0][5], 1.0), *pairs]
    rows = [(p[0], p[1]) for p in pairs] + [(p[2], p[3]) for p in pairs]
    stopped = [bool((t[m] == eos).any()) for t, m in rows]
    assert any(stopped) and not all(stopped)  # both kinds are checked
    assert all(t[0] == base.tokenizer.bos_token_id for t, _ in rows)  # ours: BOS, then the prompt
    folder = export_hf(base, tmp_path / "policy")
    model, _ = load_hf_policy(folder)
    max_prompt = max(bench_trl_dpo.prompt_lengths(base, args).values())
    trainer = DPOTrainer(model=model, args=bench_trl_dpo.trl_config(args, 0, str(tmp_path / "out"), max_prompt),
                         train_dataset=Dataset.from_dict(bench_trl_dpo.trl_dataset_rows(pairs, args.prompts)),
                         processing_class=AutoTokenizer.from_pretrained(str(folder)))
    assert bench_trl_dpo.token_mismatches(pairs, trainer) == 0
    # and the check does catch a difference: a pair whose chosen completion lost a token
    chosen, mask = pairs[0][0].clone(), pairs[0][1].clone()
    mask[int(mask.nonzero().max())] = False
    assert bench_trl_dpo.token_mismatches([(chosen, mask, *pairs[0][2:])], trainer) == 1


def test_dpo_pairs_whose_text_does_not_tokenize_back_are_found():
    import torch

    from rlhf_tutorial.trainers import bench_trl_dpo, dpo
    from rlhf_tutorial.worlds import load_policy

    base = load_policy("tiny", device="cpu")
    args = dpo.DPOArgs.preset("tiny")
    prompt = base.to_tokens(args.prompts[0])[0]
    eos = base.tokenizer.eos_token_id

    def row(completion: list[int]):
        tokens = torch.cat([prompt, torch.tensor(completion)])
        mask = torch.arange(len(tokens)) >= len(prompt)
        return tokens, mask, base.to_string(tokens[1:][tokens[1:] != eos])

    good, byte = row([*base.to_tokens(" good.", prepend_bos=False)[0].tolist(), eos]), row([131, eos])
    assert "\ufffd" in byte[2]  # a lone byte of a multi-byte character
    assert bench_trl_dpo.text_round_trips((good[0], good[1], good[0], good[1], good[2], good[2], 1.0), base, args)
    assert not bench_trl_dpo.text_round_trips((good[0], good[1], byte[0], byte[1], good[2], byte[2], 1.0), base, args)


def test_dpo_smoke_race_reports_both_sides():
    summary = bench_trl.main(["--algo", "dpo", "--smoke", "--seeds", "0"])
    assert summary["algo"] == "dpo" and summary["trl_version"] == trl.__version__
    assert summary["token_mismatches"] == 0
    (pairs,) = summary["pairs_per_seed"]
    assert summary["pairs_dropped_per_seed"][0] >= 0
    for side in ("ours", "trl"):
        (run,) = summary["runs"][side]
        assert run["pairs"] == pairs and run["passes"] == 2 and len(run["reward_per_pass"]) == 2
        assert run["steps"] == 2 * -(-pairs // 4)  # batch size 4, the last batch partial
        assert run["seconds_per_step"] > 0 and run["train_seconds"] > 0 and run["prepare_seconds"] > 0
        assert run["peak_memory_mb"] == run["peak_memory_mb"]  # not NaN
        assert 0.0 <= run["final_reward"] <= 1.0 and run["final_kl"] >= 0.0
        assert 0.0 <= run["pair_accuracy"] <= 1.0
        assert run["seconds_to_common_target"] is not None
    assert summary["runs"]["trl"][0]["trl_optim"]
    assert {"train_seconds", "seconds_per_step", "seconds_to_common_target", "peak_memory_mb"} <= set(
        summary["ratio_ours_over_trl"])
    assert summary["trl_differences"] == bench_trl_dpo_differences()
    # the two trained policies compared from their weights: both moved; two passes, the second in a different
    # pair order on each side, leave them apart by about as much as they moved
    (gaps,) = summary["trained_weights"]
    assert gaps["seed"] == 0 and summary["trained_weights_note"]
    ours, theirs = gaps["max_abs_weight_change_ours"], gaps["max_abs_weight_change_trl"]
    assert ours > 0 and theirs > 0 and gaps["max_abs_weight_diff_ours_trl"] <= ours + theirs
    assert gaps["max_abs_weight_diff_ours_trl"] > 0.1 * min(ours, theirs)


DPO_METRICS = ("final_reward", "final_kl", "pair_accuracy", "reward_margin")


def test_dpo_one_pass_trains_the_same_weights_and_each_side_is_measured_on_its_own(monkeypatch):
    """One pass: both sides see the pairs in the same order and run the same step, so their weights agree to
    float rounding and so do their numbers. Each side's numbers come from its own weights: perturbing TRL's
    read-back weights changes TRL's numbers and the weight difference, not ours."""
    import torch

    from rlhf_tutorial.trainers import bench_trl_dpo

    race = ["--algo", "dpo", "--smoke", "--seeds", "0", "--rounds", "1"]
    same = bench_trl.main(race)
    (gaps,) = same["trained_weights"]
    moved = min(gaps["max_abs_weight_change_ours"], gaps["max_abs_weight_change_trl"])
    assert moved > 0 and gaps["max_abs_weight_diff_ours_trl"] < 0.1 * moved
    ours, theirs = same["runs"]["ours"][0], same["runs"]["trl"][0]
    assert ours["final_reward"] == theirs["final_reward"] and ours["pair_accuracy"] == theirs["pair_accuracy"]
    assert abs(ours["final_kl"] - theirs["final_kl"]) < 1e-3 and abs(ours["reward_margin"] - theirs["reward_margin"]) < 1e-3

    noise_max = []
    read_back = bench_trl_dpo.tl_from_hf

    def perturbed(model, template):  # TRL's weights as read back, with noise on the unembedding
        policy = read_back(model, template)
        noise = 0.02 * torch.randn(policy.W_U.shape, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            policy.unembed.W_U += noise
        noise_max.append(noise.abs().max().item())
        return policy

    monkeypatch.setattr(bench_trl_dpo, "tl_from_hf", perturbed)
    apart = bench_trl.main(race)
    assert noise_max
    assert {k: apart["runs"]["ours"][0][k] for k in DPO_METRICS} == {k: ours[k] for k in DPO_METRICS}
    assert abs(apart["runs"]["trl"][0]["reward_margin"] - theirs["reward_margin"]) > 1e-3
    (moved_apart,) = apart["trained_weights"]
    assert moved_apart["max_abs_weight_diff_ours_trl"] == pytest.approx(
        noise_max[-1], rel=0.01, abs=gaps["max_abs_weight_diff_ours_trl"])
    assert moved_apart["max_abs_weight_change_ours"] == gaps["max_abs_weight_change_ours"]


def test_dpo_weight_gaps_are_read_from_the_weight_files(tmp_path):
    """``weight_gaps``: the largest differences, over every parameter, between the files the sides wrote and
    against the starting policy; files that miss a parameter are refused."""
    import copy

    import torch

    from rlhf_tutorial.trainers import bench_trl_dpo
    from rlhf_tutorial.worlds import load_policy

    base = load_policy("tiny", device="cpu")
    ours, theirs = copy.deepcopy(base), copy.deepcopy(base)
    with torch.no_grad():
        ours.unembed.W_U[0, 0] += 0.125
        theirs.unembed.W_U[0, 0] += 0.1875  # 0.0625 from ours there
        theirs.blocks[0].attn.b_Q[1, 2] -= 0.25  # the largest: TRL's change, and the difference between the sides
    bench_trl_dpo.save_trained(ours, tmp_path / "ours.safetensors")
    bench_trl_dpo.save_trained(theirs, tmp_path / "trl.safetensors")
    gaps = bench_trl_dpo.weight_gaps(base, tmp_path / "ours.safetensors", tmp_path / "trl.safetensors")
    assert gaps == pytest.approx({"max_abs_weight_diff_ours_trl": 0.25, "max_abs_weight_change_ours": 0.125,
                                  "max_abs_weight_change_trl": 0.25}, abs=1e-5)
    same = bench_trl_dpo.weight_gaps(base, tmp_path / "ours.safetensors", tmp_path / "ours.safetensors")
    assert same["max_abs_weight_diff_ours_trl"] == 0.0 and same["max_abs_weight_change_trl"] == pytest.approx(0.125, abs=1e-5)

    from safetensors.torch import save_file

    partial = {n: p.detach().contiguous() for n, p in ours.named_parameters() if not n.startswith("unembed")}
    save_file(partial, str(tmp_path / "partial.safetensors"))
    with pytest.raises(RuntimeError, match="parameters"):
        bench_trl_dpo.weight_gaps(base, tmp_path / "ours.safetensors", tmp_path / "partial.safetensors")


def bench_trl_dpo_differences():
    from rlhf_tutorial.trainers.bench_trl_dpo import TRL_DPO_DIFFERENCES

    return TRL_DPO_DIFFERENCES
# --- PPO: our chapter-03 trainer against TRL 1.12.0's PPOTrainer, installed beside the venv (make trl-ppo) ---

import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from rlhf_tutorial.trainers import bench_trl_ppo  # noqa: E402
from rlhf_tutorial.trainers.rlhf import RLHFArgs, RLHFTrainer  # noqa: E402

needs_trl_ppo = pytest.mark.skipif(not (bench_trl_ppo.TRL_PPO_DIR / "trl").is_dir(), reason=bench_trl_ppo.INSTALL_HINT)

_CONFIG_FIELDS = """
import json
from rlhf_tutorial.trainers.bench_trl_ppo import tiny_args, trl_ppo_config
import trl
c = trl_ppo_config(tiny_args(), seed=3, out="unused")
print(json.dumps({"trl": trl.__version__, **{k: getattr(c, k) for k in (
    "seed", "per_device_train_batch_size", "gradient_accumulation_steps", "local_rollout_forward_batch_size",
    "num_mini_batches", "num_ppo_epochs", "total_episodes", "response_length", "temperature", "stop_token",
    "stop_token_id", "missing_eos_penalty", "kl_coef", "kl_estimator", "cliprange", "cliprange_value", "vf_coef",
    "gamma", "lam", "whiten_rewards", "num_sample_generations")}}))
"""


@needs_trl_ppo
def test_settings_map_onto_a_ppo_config():
    repo = Path(bench_trl_ppo.__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(bench_trl_ppo.TRL_PPO_DIR), str(repo)])}
    done = subprocess.run([sys.executable, "-c", _CONFIG_FIELDS], env=env, capture_output=True, text=True, check=True)
    c = json.loads(done.stdout.strip().splitlines()[-1])
    args = RLHFArgs.preset("tiny")
    assert c["trl"] == "1.12.0" and c["seed"] == 3
    # one phase = one PPO batch of batch_size rollouts, generated in one call, num_minibatches steps per pass
    assert c["per_device_train_batch_size"] * c["gradient_accumulation_steps"] == args.batch_size
    assert c["gradient_accumulation_steps"] == 1 and c["local_rollout_forward_batch_size"] == args.batch_size
    assert (c["num_mini_batches"], c["num_ppo_epochs"]) == (args.num_minibatches, args.update_epochs)
    assert c["total_episodes"] == args.num_phases * args.batch_size
    assert (c["response_length"], c["temperature"]) == (args.gen_len, args.temperature)
    assert c["stop_token"] is None and c["stop_token_id"] is None and c["missing_eos_penalty"] is None
    # GAE over per-token rewards with the k1 KL (ours: compute_per_token_rewards), the same coefficients
    assert args.advantage_estimator == "gae" and (c["kl_coef"], c["kl_estimator"]) == (args.kl_coef, "k1")
    assert (c["cliprange"], c["vf_coef"], c["gamma"], c["lam"], c["whiten_rewards"]) == (
        args.clip_coef, args.vf_coef, args.gamma, args.gae_lambda, args.whiten_rewards)
    assert args.cliprange_value is None and c["cliprange_value"] >= 1e6  # ours does not clip values: TRL's never binds
    assert c["num_sample_generations"] == 0


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step()`")
def test_optimizer_schedule_and_value_head_match_ours():
    from rlhf_tutorial.trainers.export import to_hf
    from rlhf_tutorial.worlds import load_policy

    args = RLHFArgs.preset("tiny", seed=5)
    policy = load_policy("tiny", device="cpu")
    ours = RLHFTrainer(args, model=policy, ref_model=load_policy("tiny", device="cpu"),
                       reward_fn=lambda texts: torch.zeros(len(texts)))
    head = bench_trl_ppo.value_head(policy.cfg.d_model, seed=5)
    for theirs, mine in zip(ours.model.value_head.state_dict().values(), head.state_dict().values()):
        assert torch.equal(theirs, mine)  # the same initial value head for the same seed
    hf = to_hf(policy)
    value_model = bench_trl_ppo.ValueModel(hf, head)
    optimizer, scheduler = bench_trl_ppo.trl_optimizer(args, hf, value_model)
    trunk, value = optimizer.param_groups
    assert (trunk["lr"], value["lr"]) == (ours.optimizer.param_groups[0]["lr"], ours.optimizer.param_groups[1]["lr"])
    assert trunk["weight_decay"] == value["weight_decay"] == ours.optimizer.param_groups[0]["weight_decay"] == 0.0
    n_trunk = sum(p.numel() for p in trunk["params"])
    assert n_trunk == sum(p.numel() for p in hf.parameters()) + sum(p.numel() for p in value_model.transformer.parameters())
    lrs, ours_lrs = [], []
    for _ in range(args.num_phases + 1):  # the same schedule, stepped once a phase
        lrs.append(optimizer.param_groups[0]["lr"])
        ours_lrs.append(ours.optimizer.param_groups[0]["lr"])
        scheduler.step()
        ours.scheduler.step()
    assert lrs == pytest.approx(ours_lrs)


@needs_trl_ppo
def test_ppo_smoke_race_reports_both_sides():
    summary = bench_trl.main(["--algo", "ppo", "--smoke", "--seeds", "0"])
    assert summary["algo"] == "ppo" and summary["trl_version"] == "1.12.0"
    for side in ("ours", "trl"):
        (run,) = summary["runs"][side]
        assert run["phases"] == 2 and len(run["reward_per_phase"]) == 2
        assert all(0.0 <= r <= 1.0 for r in run["reward_per_phase"]) and 0.0 <= run["final_reward"] <= 1.0
        assert set(run["seconds_per_phase_split"]) == set(SECTIONS)
        assert run["seconds_per_phase"] > 0 and run["wall_seconds"] > 0
        assert run["seconds_per_phase_split"]["sampling"] > 0 and run["seconds_per_phase_split"]["ref_logprobs"] > 0
        assert run["peak_memory_mb"] == run["peak_memory_mb"]  # not NaN
    assert summary["runs"]["trl"][0]["trl_version"] == "1.12.0"
    assert set(summary["ratio_ours_over_trl"]) == {"seconds_to_target", "seconds_per_phase", "peak_memory_mb",
                                                   "process_peak_mb"}
    assert summary["trl_differences"] == bench_trl_ppo.TRL_PPO_DIFFERENCES


def test_ppo_race_without_the_side_install_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_trl_ppo, "TRL_PPO_DIR", tmp_path / "absent")
    summary = bench_trl.main(["--algo", "ppo", "--smoke", "--seeds", "0"])
    assert set(summary) == {"error"} and "make trl-ppo" in summary["error"]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "ppo", "dpo"])
def test_gpt2_size_smoke_race_runs_on_the_real_vocabulary(algo):
    """``--size gpt2 --smoke``: the GPT-2-size path end to end, cheaply: a 1-layer, d_model 64 trunk (the full
    12 x 768 one takes minutes a phase on 2 busy cores) with GPT-2's real 50,257-token vocabulary, the stand-in
    reward, both sides reporting time, split and memory."""
    if algo == "ppo" and not (bench_trl_ppo.TRL_PPO_DIR / "trl").is_dir():
        pytest.skip(bench_trl_ppo.INSTALL_HINT)
    summary = bench_trl.main(["--algo", algo, "--size", "gpt2", "--smoke", "--seeds", "0", "--threads", "1"])
    assert summary["size"] == "gpt2" and summary["policy"]["d_vocab"] == 50257 and summary["policy"]["n_layers"] == 1
    assert "fresh process" in summary["memory_counted"]
    for side in ("ours", "trl"):
        (run,) = summary["runs"][side]
        assert run["peak_memory_mb"] > 0 and run["wall_seconds"] > 0
        # each side in a process of its own: the loaded policy (on either device: the course's, TRL's moved
        # there before the measured block) then training on top; on the CPU the libraries too
        policy_mb = summary["policy"]["n_params"] * 4 / 2**20
        assert run["loaded_memory_mb"] >= 0.95 * policy_mb, (side, run["loaded_memory_mb"], policy_mb)
        if summary["device"] == "cpu":
            assert run["loaded_memory_mb"] > 100
        assert run["process_peak_mb"] >= run["loaded_memory_mb"] + run["peak_memory_mb"] - 1
        if algo != "dpo":
            assert set(run["seconds_per_phase_split"]) == set(SECTIONS) and run["seconds_per_phase"] > 0
        else:
            assert run["seconds_per_step"] > 0 and run["prepare_seconds"] > 0
    assert summary["ratio_ours_over_trl"]["peak_memory_mb"] is not None
    if algo == "dpo":  # the weights each side's process wrote, compared here
        (gaps,) = summary["trained_weights"]
        moved = gaps["max_abs_weight_change_ours"], gaps["max_abs_weight_change_trl"]
        assert min(moved) > 0 and 0 < gaps["max_abs_weight_diff_ours_trl"] <= sum(moved)


def test_size_defaults_follow_the_size():
    import argparse

    p = argparse.ArgumentParser()
    bench_trl.common_flags(p)
    tiny = bench_trl.resolve_common(p.parse_args([]))
    gpt2 = bench_trl.resolve_common(p.parse_args(["--size", "gpt2"]))
    assert (tiny.seeds, tiny.threads) == ([0, 1, 2, 3], 1) and (gpt2.seeds, gpt2.threads) == ([0, 1], 2)
    assert bench_trl.resolve_common(p.parse_args(["--size", "gpt2", "--threads", "1"])).threads == 1



def allocate_and_report(mb: int) -> dict:
    """A side for ``isolated``: allocates ``mb`` MB under ``PeakMemory``; its memory figures and process id."""
    import os

    import torch

    with bench_trl.PeakMemory("cpu") as memory:
        block = torch.ones(mb * 2**18)  # mb MB of float32
        block += 1
    return {"pid": os.getpid(), **bench_trl.memory_fields(memory)}


@pytest.mark.cpu_only
def test_isolated_sides_each_get_a_fresh_process_and_count_the_same_way():
    """cpu_only: it measures resident CPU memory. Two isolated runs of the same side each run in a new process
    (not this one, not each other's) and see the same allocation in full: nothing freed by an earlier side is
    reused (in one process the second allocation would come out of the first's freed pages)."""
    import os

    first = bench_trl.isolated(allocate_and_report, 1, mb=300)
    second = bench_trl.isolated(allocate_and_report, 1, mb=300)
    assert len({first["pid"], second["pid"], os.getpid()}) == 3
    for run in (first, second):
        assert 280 < run["peak_memory_mb"] < 400
        assert run["process_peak_mb"] >= run["loaded_memory_mb"] + 280


def test_isolated_side_failure_says_which_side_failed():
    with pytest.raises(RuntimeError, match="allocate_and_report failed in its process"):
        bench_trl.isolated(allocate_and_report, 1, mb="not a number")
