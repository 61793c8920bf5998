"""Chapter 07's figures (plotly): pass@k curves, GRPO's reward / entropy / length per phase, the
hacked verifier, held-out accuracy and best-of-N's reward against KL. They draw numbers that
``trainers.reasoning`` and ``trainers.grpo`` computed; nothing is computed here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rlhf_tutorial.widgets.live import LiveDashboard

#: What the live GRPO dashboard of chapter 07 draws per phase (the keys of the trainer's phase records).
REASONING_PANELS = ["reward", "frac_reward_zero_std", "entropy", "completion_len"]
REASONING_TITLES = {"reward": "reward (pass rate of the sampled groups)", "frac_reward_zero_std": "groups all right or all wrong",
                    "entropy": "entropy per token (nats)", "completion_len": "completion length (tokens)"}


def reasoning_dashboard(title: str = "GRPO on arithmetic", static: bool | None = None) -> LiveDashboard:
    """Chapter 07's live GRPO curves: reward, the fraction of all-equal groups (what dynamic sampling drops),
    the policy's entropy per token and the completion length, per phase. Pass its ``update`` as the trainer's
    ``callback``, then call ``finish()``."""
    return LiveDashboard(REASONING_PANELS, title=title, titles=REASONING_TITLES, cols=4, x_title="phase",
                         static=static, height_per_row=240)


def pass_at_k_figure(curves: Mapping[str, Mapping[int, float]], title: str = "pass@k") -> go.Figure:
    """One line per model: pass@k against k (log axis)."""
    fig = go.Figure()
    for name, table in curves.items():
        ks = sorted(int(k) for k in table)
        fig.add_trace(go.Scatter(x=ks, y=[table[k] if k in table else table[str(k)] for k in ks],
                                 mode="lines+markers", name=name))
    fig.update_layout(title=title, xaxis=dict(title="k (samples)", type="log", tickvals=[1, 2, 4, 8, 16, 32, 64]),
                      yaxis=dict(title="pass@k", range=[0, 1.02]), height=420)
    return fig


def phase_curves(runs: Mapping[str, Sequence[Mapping[str, Any]]], keys: Sequence[tuple[str, str]],
                 title: str) -> go.Figure:
    """One panel per (key, label) of the phase records, one line per run."""
    fig = make_subplots(rows=1, cols=len(keys), subplot_titles=[label for _, label in keys])
    for i, (key, _) in enumerate(keys, start=1):
        for j, (name, history) in enumerate(runs.items()):
            fig.add_trace(go.Scatter(x=[r["phase"] for r in history if key in r], y=[r[key] for r in history if key in r],
                                     mode="lines", name=name, legendgroup=name, showlegend=i == 1,
                                     line=dict(color=f"hsl({(j * 137) % 360}, 60%, 45%)")), row=1, col=i)
        fig.update_xaxes(title_text="phase", row=1, col=i)
    fig.update_layout(title=title, height=360)
    return fig


def grpo_reasoning_curves(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> go.Figure:
    """Reward, entropy per token (nats) and completion length (tokens) per phase."""
    return phase_curves(runs, [("reward", "reward (sampled groups)"), ("entropy", "entropy per token (nats)"),
                               ("completion_len", "completion length (tokens)")], "GRPO on arithmetic")


def held_out_figure(accuracy: Mapping[str, Mapping[int, float]], title: str = "pass@1 by difficulty") -> go.Figure:
    """Grouped bars: pass@1 of each model at each difficulty."""
    fig = go.Figure()
    for name, by_difficulty in accuracy.items():
        ds = sorted(by_difficulty)
        fig.add_trace(go.Bar(x=[f"{d} operation{'s' if d > 1 else ''}" for d in ds],
                             y=[by_difficulty[d] for d in ds], name=name))
    fig.update_layout(title=title, barmode="group", yaxis=dict(title="pass@1", range=[0, 1]), height=380)
    return fig


def best_of_n_figure(ns: Sequence[int], reward: Sequence[float], kl_analytic: Sequence[float],
                     kl_measured: Sequence[float], points: Mapping[str, tuple[float, float]] | None = None) -> go.Figure:
    """Best-of-N's pass rate against its KL (the analytic log N - (N-1)/N and the measured one), with
    other methods as points (name -> (KL, pass rate))."""
    fig = go.Figure()
    text = [f"N = {n}" for n in ns]
    fig.add_trace(go.Scatter(x=list(kl_analytic), y=list(reward), mode="lines+markers", name="best-of-N, analytic KL",
                             text=text))
    fig.add_trace(go.Scatter(x=list(kl_measured), y=list(reward), mode="lines+markers", name="best-of-N, measured KL",
                             text=text, line=dict(dash="dot")))
    for name, (kl, r) in (points or {}).items():
        fig.add_trace(go.Scatter(x=[kl], y=[r], mode="markers", marker=dict(size=12, symbol="diamond"), name=name))
    fig.update_layout(title="Best-of-N on the reward-KL plane", xaxis_title="KL(policy || base), nats",
                      yaxis=dict(title="pass rate", range=[0, 1.02]), height=420)
    return fig
