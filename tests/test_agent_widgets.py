"""Chapter 09's visuals (rlhf_tutorial/widgets/agent.py): the trajectory viewer tells the policy's tokens
from the environment's, the dashboard draws the trainer's phase records, the bars take a missing value."""

import math

import plotly.graph_objects as go
import torch

from rlhf_tutorial.agent import AgentRollout, policy_token_mask
from rlhf_tutorial.widgets.agent import (
    AGENT_PANELS,
    ENV_BACKGROUND,
    agent_dashboard,
    by_difficulty_figure,
    trajectory_html,
    trajectory_viewer,
)


class CharTokenizer:
    """One character per token id (ord / chr)."""

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def _rollout() -> AgentRollout:
    # row 0: prompt "Q:", the policy writes "<c>", the environment " =4", the policy "A4", then padding;
    # row 1: prompt "Q:", the policy writes "A5" and stops
    rows = ["Q:<c> =4A4..", "Q:A5........"]
    tokens = torch.tensor([[ord(c) for c in r] for r in rows])
    spans, lengths = [[(5, 8)], []], torch.tensor([10, 4])
    mask = policy_token_mask(tokens, 2, spans, lengths)
    logprobs = torch.where(mask, torch.full(tokens.shape, -0.5), torch.zeros(tokens.shape))
    return AgentRollout(tokens, mask, logprobs, spans, lengths, torch.tensor([1, 0]), 2)


def test_the_viewer_colours_the_environment_apart_and_shows_each_turn():
    rollout = _rollout()
    page = trajectory_html(rollout, 0, CharTokenizer(), reward=1.0, correct=True)
    assert page.count(ENV_BACKGROUND) == 2 * 3  # the three environment tokens, in the text and in the turn table
    assert "turn 1 (policy)" in page and "turn 2 (policy)" in page and "turn 3" not in page
    assert "log p -1.50" in page  # turn 1: three sampled tokens at -0.5 each
    assert "1 call answered" in page and "reward <b>1.00</b>" in page
    assert ">&nbsp;</span>" in page  # a space token stays visible
    assert ">.</span>" not in page  # the padding after the trajectory's end is not shown
    other = trajectory_html(rollout, 1, CharTokenizer())
    assert ENV_BACKGROUND not in other and "0 calls answered" in other


def test_the_static_viewer_shows_every_trajectory_and_brackets_the_environment():
    view = trajectory_viewer(_rollout(), CharTokenizer(), rewards=[1.0, 0.0], correct=[True, False], static=True)
    assert view.plain.count("trajectory ") == 2
    assert "[ =4]" in view.plain and "<c>" in view.plain
    assert "trajectory 0" in view.html and "trajectory 1" in view.html


def test_the_dashboard_draws_the_trainer_records():
    dash = agent_dashboard(static=True)
    for phase in range(3):
        dash.update({"phase": phase, **{k: 0.1 * phase for k in AGENT_PANELS}, "loss": 1.0})
    dash.finish()
    assert set(AGENT_PANELS) <= set(dash.history)
    assert dash.history["calls_per_trajectory"][1] == [0.0, 0.1, 0.2]
    assert "loss" not in dash.history  # a record's entries outside the panels are not drawn
    dash.update({"phase": 3})  # a metric missing from a record is a gap
    assert math.isnan(dash.history["accuracy"][1][-1]) and dash.history["accuracy"][0][-1] == 3.0


def test_bars_by_difficulty_leave_a_missing_value_out():
    evals = {"base": {"easy": {"accuracy": 0.5, "call_rate": 0.1}, "hard": {"accuracy": 0.0, "call_rate": None}},
             "trained": {"easy": {"accuracy": 0.9, "call_rate": 0.2}, "hard": {"accuracy": 0.6, "call_rate": 0.9}}}
    fig = by_difficulty_figure(evals)
    assert isinstance(fig, go.Figure) and len(fig.data) == 4
    bars = {(t.name, t.xaxis): list(t.y) for t in fig.data}
    assert bars[("base", "x2")] == [0.1, None] and bars[("trained", "x")] == [0.9, 0.6]
