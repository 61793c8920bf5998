"""The reward over-optimisation run (tiny world): its bookkeeping, on a run small enough for a test.

The curve's shape is a measured result (the CLI's JSON summary, quoted in chapter 03), not asserted here.
"""

import json

import pytest

from rlhf_tutorial import cli
from rlhf_tutorial.trainers import overoptimization


def test_moving_average_by_hand():
    assert overoptimization.moving_average([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert overoptimization.moving_average([2.0, 4.0], 5) == [2.0, 3.0]


def test_command_is_registered():
    assert "overoptimization" in cli.COMMANDS and "overoptimization" in cli.usage()


@pytest.fixture(scope="module")
def small_summary():
    argv = ["--world", "tiny", "--seed", "0", "--rm-train-pairs", "32", "--rm-test-pairs", "32",
            "--num-phases", "3", "--batch-size", "8", "--smooth", "2", "--no-progress"]
    return overoptimization.main(argv)


def test_small_run_records_every_phase(small_summary):
    s = small_summary
    assert s["phases"] == 3
    for key in ("gold_per_phase", "proxy_per_phase", "kl_seq_per_phase", "repetition_per_phase"):
        assert len(s[key]) == 3, key
    assert all(0.0 <= g <= 1.0 for g in s["gold_per_phase"])  # a probability, measured on the rollout
    assert s["kl_seq_per_phase"][0] == pytest.approx(0.0, abs=1e-5)  # phase 0: the policy is the reference
    assert 0 <= s["gold_peak_phase"] < 3
    assert s["gold_peak_smoothed"] == pytest.approx(
        max(overoptimization.moving_average(s["gold_per_phase"], 2)), abs=1e-4)
    assert 0.0 <= s["proxy_heldout_accuracy"] <= 1.0 and s["wall_seconds"] > 0
    json.dumps(s)  # the CLI prints it


def test_figure_has_both_curves(small_summary):
    fig = overoptimization.figure(small_summary)
    names = [trace.name for trace in fig.data if trace.name]
    assert any("gold" in n for n in names) and any("proxy" in n for n in names)
