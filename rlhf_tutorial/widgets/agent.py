"""Chapter 09 visuals: the trajectory viewer, the agent's live training curves, and accuracy and
tool calls by difficulty.

- :func:`trajectory_viewer`: a multi-turn trajectory turn by turn, the prompt in grey, the tokens the
  policy sampled shaded by their log-probability (darker: less likely; hover a token for its number)
  and the environment's tokens in blue (never sampled: no log-probability), then one row per turn. In
  Jupyter a dropdown picks the trajectory (ipywidgets); elsewhere, or with ``static=True``, every
  trajectory as HTML (notebook) or text (terminal). Its input is an ``agent.AgentRollout`` as
  ``multi_turn_rollout`` returned it and the policy's tokenizer: it reads the rollout's tokens, spans,
  mask and log-probs, and computes nothing.
- :func:`agent_dashboard`: reward, accuracy, calls and turns per trajectory and length per phase, live
  (``train_agent(..., callback=dash.update)``, then ``finish()``).
- :func:`by_difficulty_figure`: grouped bars of a per-difficulty measurement (``trainers.agent.evaluate``'s
  keys: accuracy, call rate, ...) for several models or runs.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rlhf_tutorial.agent import AgentRollout
from rlhf_tutorial.display import HTMLText, widgets_available
from rlhf_tutorial.widgets.live import Explorer, LiveDashboard, html_output

ENV_BACKGROUND = "rgba(9,105,218,0.22)"

# ----------------------------------------------------------------------------------------------------
# The trajectory viewer
# ----------------------------------------------------------------------------------------------------


def _pieces(rollout: AgentRollout, row: int, tokenizer: Any) -> list[tuple[str, str, float | None]]:
    """Row ``row`` of the rollout as (kind, token text, log-prob) per position up to its end: kind
    'prompt', 'policy' (the mask is True) or 'env' (in an environment span)."""
    env = {t for start, end in rollout.env_spans[row] for t in range(start, end)}
    out = []
    for t in range(int(rollout.lengths[row])):
        text = tokenizer.decode([int(rollout.tokens[row, t])])
        if t < rollout.prompt_len:
            out.append(("prompt", text, None))
        elif t in env:
            out.append(("env", text, None))
        else:
            kind = "policy" if bool(rollout.mask[row, t]) else "env"
            out.append((kind, text, float(rollout.logprobs[row, t]) if kind == "policy" else None))
    return out


def _turns(pieces: list[tuple[str, str, float | None]]) -> list[tuple[str, list[tuple[str, str, float | None]]]]:
    """Consecutive pieces of one kind grouped: [(kind, pieces), ...]."""
    turns: list[tuple[str, list]] = []
    for piece in pieces:
        if turns and turns[-1][0] == piece[0]:
            turns[-1][1].append(piece)
        else:
            turns.append((piece[0], [piece]))
    return turns


def _shown(text: str) -> str:
    return html.escape(text).replace(" ", "&nbsp;").replace("\n", "\\n") or "&#8203;"


def _token_span(kind: str, text: str, logprob: float | None) -> str:
    if kind == "prompt":
        return f"<span style='color:#6e7781'>{_shown(text)}</span>"
    if kind == "env":
        return (f"<span title='written by the environment (not sampled, not trained on)' "
                f"style='background:{ENV_BACKGROUND};padding:1px 1px;border-radius:2px'>{_shown(text)}</span>")
    surprise = min(-(logprob or 0.0) / 4.0, 1.0)  # 4 nats and more: the darkest
    return (f"<span title='log p {logprob:.3f} (p = {math.exp(logprob):.3f})' style='background:"
            f"rgba(130,80,223,{0.08 + 0.6 * surprise:.2f});padding:1px 1px;border-radius:2px'>{_shown(text)}</span>")


def trajectory_html(rollout: AgentRollout, row: int, tokenizer: Any, reward: float | None = None,
                    correct: bool | None = None) -> str:
    """One trajectory: its tokens coloured by who wrote them, then a table of its turns."""
    pieces = _pieces(rollout, row, tokenizer)
    calls = len(rollout.env_spans[row])
    head = (f"<div style='font-family:sans-serif;margin:6px 0'>trajectory {row}: {calls} call{'s' * (calls != 1)} "
            f"answered, {int(rollout.lengths[row]) - rollout.prompt_len} positions after the prompt"
            + (f" &middot; reward <b>{reward:.2f}</b>" if reward is not None else "")
            + (f" &middot; answer {'right' if correct else 'wrong'}" if correct is not None else "") + "</div>")
    tokens = "".join(_token_span(*p) for p in pieces)
    rows = []
    number = 0
    for kind, group in _turns(pieces):
        if kind == "policy":
            number += 1
            who = f"turn {number} (policy)"
            lp = sum(p[2] for p in group)
            numbers = f"{len(group)} tokens, log p {lp:.2f}"
        else:
            who, numbers = ("prompt", f"{len(group)} tokens") if kind == "prompt" else (
                "environment", f"{len(group)} tokens, not trained on")
        rows.append(f"<tr><td style='padding:1px 6px'>{who}</td><td style='padding:1px 6px;font-family:monospace'>"
                    f"{''.join(_token_span(*p) for p in group)}</td><td style='padding:1px 6px;color:#57606a'>"
                    f"{numbers}</td></tr>")
    return (head + f"<div style='font-family:monospace;font-size:105%;line-height:1.9'>{tokens}</div>"
            "<table style='border-collapse:collapse;font-size:90%'>" + "".join(rows) + "</table>")


def trajectory_text(rollout: AgentRollout, row: int, tokenizer: Any, reward: float | None = None) -> str:
    """One trajectory as plain text: the environment's text in [brackets], then the policy's log-prob per turn."""
    groups = _turns(_pieces(rollout, row, tokenizer))
    parts = [f"[{''.join(p[1] for p in g)}]" if k == "env" else "".join(p[1] for p in g) for k, g in groups]
    turns = [sum(p[2] for p in g) for k, g in groups if k == "policy"]
    return (f"trajectory {row}" + (f" (reward {reward:.2f})" if reward is not None else "") + f": {''.join(parts)!r}\n"
            "  log p per policy turn: " + ", ".join(f"{x:.2f}" for x in turns))


_LEGEND = ("<div style='font-family:sans-serif;font-size:90%;color:#57606a'>Grey: the prompt. Purple: tokens "
           "the policy sampled, darker when less likely (hover for log p). Blue: the environment's text "
           "(the calculator's result), appended as token ids: not sampled, so the mask leaves it out of "
           "training.</div>")


def trajectory_viewer(rollout: AgentRollout, tokenizer: Any, rewards: Sequence[float] | None = None,
                      correct: Sequence[bool] | None = None, static: bool | None = None):
    """The rollout's trajectories, turn by turn: a dropdown over them in Jupyter (ipywidgets), every one
    as HTML / text elsewhere or with ``static=True``."""
    n = int(rollout.tokens.shape[0])
    rewards = [float(r) for r in rewards] if rewards is not None else [None] * n
    correct = [bool(c) for c in correct] if correct is not None else [None] * n

    def one(i: int) -> str:
        return trajectory_html(rollout, i, tokenizer, rewards[i], correct[i])

    if static is None:
        static = not widgets_available()
    if static:
        return HTMLText(_LEGEND + "".join(one(i) for i in range(n)),
                        "\n".join(trajectory_text(rollout, i, tokenizer, rewards[i]) for i in range(n)))
    import ipywidgets as widgets

    options = [(f"{i}: {len(rollout.env_spans[i])} call(s)" + (f", reward {rewards[i]:.2f}" if rewards[i] is not None else ""), i)
               for i in range(n)]
    pick = widgets.Dropdown(options=options, value=0, description="trajectory", layout=widgets.Layout(width="50%"))
    return Explorer([pick], lambda: html_output(_LEGEND + one(pick.value)),
                    text=lambda: trajectory_text(rollout, pick.value, tokenizer, rewards[pick.value]))


# ----------------------------------------------------------------------------------------------------
# Curves and bars
# ----------------------------------------------------------------------------------------------------

#: What the live dashboard draws per phase (the keys of ``train_agent``'s phase records).
AGENT_PANELS = ["reward", "accuracy", "calls_per_trajectory", "turns_per_trajectory", "length"]
AGENT_TITLES = {"reward": "mean reward", "accuracy": "accuracy (sampled trajectories)",
                "calls_per_trajectory": "calls per trajectory", "turns_per_trajectory": "turns per trajectory",
                "length": "length (positions after the prompt)"}


def agent_dashboard(title: str = "GRPO on trajectories", static: bool | None = None) -> LiveDashboard:
    """Chapter 09's live curves: reward, accuracy, calls and turns per trajectory, length, per phase. Pass its
    ``update`` as ``train_agent(..., callback=dash.update)``, then call ``finish()``."""
    return LiveDashboard(AGENT_PANELS, title=title, titles=AGENT_TITLES, cols=3, x_title="phase", static=static,
                         height_per_row=240)


def by_difficulty_figure(evals: Mapping[str, Mapping[str, Mapping[str, Any]]],
                         keys: Sequence[tuple[str, str]] = (("accuracy", "accuracy"),
                                                            ("call_rate", "trajectories with a call")),
                         title: str = "By difficulty") -> go.Figure:
    """One panel per (key, label), grouped bars: per difficulty, one bar per entry of ``evals``
    (name -> ``trainers.agent.evaluate``'s result: difficulty -> measurements). A missing value (None) is
    no bar."""
    fig = make_subplots(rows=1, cols=len(keys), subplot_titles=[label for _, label in keys])
    for i, (key, _) in enumerate(keys, start=1):
        for j, (name, ev) in enumerate(evals.items()):
            ds = list(ev)
            fig.add_trace(go.Bar(x=ds, y=[ev[d].get(key) for d in ds], name=name, legendgroup=name,
                                 showlegend=i == 1, marker_color=f"hsl({(j * 137 + 210) % 360}, 55%, 50%)"),
                          row=1, col=i)
        fig.update_yaxes(rangemode="tozero", row=1, col=i)
        fig.update_xaxes(title_text="difficulty", row=1, col=i)
    fig.update_layout(title=title, barmode="group", height=400, margin=dict(b=110),
                      legend=dict(orientation="h", yanchor="top", y=-0.28))
    return fig
