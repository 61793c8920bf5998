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
    # ours keeps the sampler's log-probs (no old-policy forward); TRL runs one
    assert summary["runs"]["ours"][0]["seconds_per_phase_split"]["old_logprobs"] == 0.0
    assert summary["runs"]["trl"][0]["seconds_per_phase_split"]["old_logprobs"] > 0.0
    assert set(summary["ratio_ours_over_trl"]) == {"seconds_to_target", "seconds_per_phase", "peak_memory_mb"}
    assert summary["trl_differences"]
