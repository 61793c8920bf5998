"""Chapter 04 visuals: the group viewer, GRPO's training curves, and the PPO-vs-GRPO figure.

- :func:`group_viewer`: per prompt, its G completions with their rewards and advantages, each token
  of a completion outlined where the ratio pi_theta / pi_old is clipped (hover a token for its
  ratio). In Jupyter it is a dropdown over the groups (ipywidgets); elsewhere, or with
  ``static=True``, a :func:`group_table` that renders as HTML (notebook, report) or as text (terminal).
  Its input is ``grpo.group_record(policy, rollout, args)``.
- :func:`grpo_curves`: reward, fraction of all-equal groups, KL and clip fraction per phase.
- :func:`comparison_figure`: PPO vs GRPO in one figure: reward per phase, wall time, peak memory.
- :func:`truncation_text`: how many completions were cut off at the length limit and what the reward
  paid them (chapter 04's overlong cell).
- :func:`write_report`: all of the above in one HTML file (``train-grpo --report``).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rlhf_tutorial.display import HTMLText, widgets_available
from rlhf_tutorial.widgets.live import Explorer, LiveDashboard, html_output

COLOURS = {"PPO": "#1f77b4", "GRPO": "#d62728"}


# ----------------------------------------------------------------------------------------------------
# The group viewer
# ----------------------------------------------------------------------------------------------------


def _adv_colour(a: float) -> str:
    """Green for a positive advantage, red for a negative one, stronger with |A| (saturating at 2)."""
    alpha = min(abs(a) / 2.0, 1.0) * 0.55
    rgb = "26,127,55" if a >= 0 else "207,34,46"
    return f"rgba({rgb},{alpha:.2f})"


def _token_html(token: str, ratio: float, clipped: bool) -> str:
    text = html.escape(token).replace(" ", "&nbsp;").replace("\n", "\\n") or "&#8203;"
    style = "padding:0 1px;margin:0 1px;border-radius:2px;"
    style += "outline:2px solid #e36209;background:#fff1e5;" if clipped else "background:#f3f4f6;"
    title = f"ratio {ratio:.3f}" + (" (clipped)" if clipped else "")
    return f"<span title='{title}' style='{style}'>{text}</span>"


def group_html(group: dict[str, Any], index: int | None = None) -> str:
    """One group as an HTML table: reward, advantage and the tokens of each completion."""
    completions = group["completions"]
    rewards = [c["reward"] for c in completions]
    flat = max(rewards) - min(rewards) < 1e-6
    n_clipped = sum(sum(c["clipped"]) for c in completions)
    n_tokens = sum(len(c["clipped"]) for c in completions)
    title = f"group {index}: " if index is not None else ""
    head = (
        f"<div style='font-family:sans-serif;margin:6px 0 2px'><b>{title}prompt</b> "
        f"<code>{html.escape(group['prompt'])}</code> &middot; G = {len(completions)} &middot; mean reward "
        f"{sum(rewards) / len(rewards):.3f} &middot; clipped tokens {n_clipped}/{n_tokens}"
        + (" &middot; <b style='color:#cf222e'>all rewards equal: zero advantage, no signal</b>" if flat else "")
        + "</div>"
    )
    rows = []
    for c in sorted(completions, key=lambda c: -c["advantage"]):
        tokens = "".join(_token_html(t, r, k) for t, r, k in zip(c["tokens"], c["ratio"], c["clipped"]))
        rows.append(
            f"<tr><td style='text-align:right;padding:2px 6px;font-family:monospace'>{c['reward']:.3f}</td>"
            f"<td style='text-align:right;padding:2px 6px;font-family:monospace;background:{_adv_colour(c['advantage'])}'>"
            f"{c['advantage']:+.2f}</td><td style='padding:2px 6px;font-family:monospace;font-size:90%'>{tokens}</td></tr>"
        )
    return (
        head + "<table style='border-collapse:collapse'><tr><th>reward</th><th>advantage</th>"
        "<th style='text-align:left'>completion (outlined: ratio clipped; hover: ratio)</th></tr>"
        + "".join(rows) + "</table>"
    )


def group_text(group: dict[str, Any], index: int | None = None) -> str:
    """One group as plain text: clipped tokens in [brackets]."""
    lines = [f"group {index if index is not None else ''}: prompt {group['prompt']!r}"]
    for c in sorted(group["completions"], key=lambda c: -c["advantage"]):
        tokens = "".join(f"[{t}]" if k else t for t, k in zip(c["tokens"], c["clipped"]))
        lines.append(f"  r={c['reward']:.3f}  A={c['advantage']:+.2f}  {tokens!r}")
    return "\n".join(lines)


def group_table(groups: Sequence[dict[str, Any]], max_groups: int | None = None) -> HTMLText:
    """The static group viewer: every group (or the first ``max_groups``) as HTML or text."""
    groups = list(groups)[:max_groups] if max_groups else list(groups)
    legend = ("<div style='font-family:sans-serif;font-size:90%;color:#57606a'>Rows sorted by advantage; "
              "advantage cell green (A > 0) or red (A < 0); a token outlined in orange has its ratio "
              "pi_theta / pi_old outside the clip range on the side of its advantage: its gradient is "
              "zero.</div>")
    return HTMLText(
        legend + "".join(group_html(g, i) for i, g in enumerate(groups)),
        "\n\n".join(group_text(g, i) for i, g in enumerate(groups)) + "\n([token]: ratio clipped)",
    )


def group_viewer(groups: Sequence[dict[str, Any]], static: bool | None = None):
    """The group viewer of ``grpo.group_record(...)``: a dropdown over the groups in Jupyter (ipywidgets),
    a :func:`group_table` elsewhere or with ``static=True``."""
    groups = list(groups)
    if static is None:
        static = not widgets_available()
    if static or not groups:
        return group_table(groups)
    import ipywidgets as widgets

    options = [(f"{i}: {g['prompt']!r}  (mean r {sum(c['reward'] for c in g['completions']) / len(g['completions']):.2f})", i)
               for i, g in enumerate(groups)]
    pick = widgets.Dropdown(options=options, value=0, description="group", layout=widgets.Layout(width="60%"))
    return Explorer([pick], lambda: html_output(group_html(groups[pick.value], pick.value)))


# ----------------------------------------------------------------------------------------------------
# Curves and the comparison
# ----------------------------------------------------------------------------------------------------


GRPO_PANELS = ["reward", "frac_reward_zero_std", "kl", "clip_active_frac"]
GRPO_TITLES = {"reward": "mean reward", "frac_reward_zero_std": "frac_reward_zero_std",
               "kl": "KL(policy || ref), k3 per token", "clip_active_frac": "clipped tokens (zero gradient)"}


def grpo_dashboard(title: str = "GRPO", static: bool | None = None) -> LiveDashboard:
    """Chapter 04's live training curves (reward, all-equal groups, KL, clip fraction per phase): the same four
    panels as :func:`grpo_curves`, redrawn after every phase while the cell runs. Pass its ``update`` as
    ``train(..., callback=dash.update)``, then call ``finish()``."""
    live = LiveDashboard(GRPO_PANELS, title=title, titles=GRPO_TITLES, cols=4, x_title="phase", static=static,
                         height_per_row=240)
    # A fraction: its axis stays [0, 1] (a constant 0, as with the classifier's reward, would span -1 to 1).
    live.fig.layout[f"yaxis{GRPO_PANELS.index('frac_reward_zero_std') + 1}"].range = [-0.02, 1.02]
    return live


def grpo_curves(history: Sequence[dict[str, Any]], title: str = "GRPO") -> go.Figure:
    """Reward, fraction of all-equal groups, KL to the reference and clip fraction, per phase (static)."""
    dash = grpo_dashboard(title=title, static=True)
    for record in history:
        dash.update(record)
    return dash.to_figure()


def comparison_figure(runs: dict[str, dict[str, Any]], title: str = "PPO vs GRPO on the same task") -> go.Figure:
    """One figure: the reward of every phase, the wall time and the peak memory of each run.

    ``runs`` maps a name ("PPO", "GRPO") to a dict with ``reward_per_phase`` (a list), ``wall_seconds``
    and ``peak_memory_mb``, such as the CLI summaries of ``train-rlhf`` and ``train-grpo`` or
    :func:`run_summary` of an in-notebook run; ``samples_per_phase`` is shown in the legend when given.
    When every run also has ``peak_memory_training_mb`` (the peak above the memory in use when the
    training loop started), that is shown instead of the whole process's peak. The memory is that of
    the device the runs name (``device`` in the CLI summaries): a GPU's is named in the title.
    """
    training = all(run.get("peak_memory_training_mb") is not None for run in runs.values())
    memory_key = "peak_memory_training_mb" if training else "peak_memory_mb"
    devices = sorted({str(run["device"]) for run in runs.values() if run.get("device")})
    where = f"{devices[0]} " if len(devices) == 1 and devices[0] != "cpu" else ""  # a GPU: named
    memory_title = f"peak {where}memory (MB)<br>" + ("of training" if training else "of the process")
    fig = make_subplots(rows=1, cols=3, column_widths=[0.56, 0.22, 0.22], horizontal_spacing=0.07,
                        subplot_titles=["mean reward per phase", "wall time (s)", memory_title])
    for name, run in runs.items():
        colour = COLOURS.get(name)
        rewards = run["reward_per_phase"]
        label = name + (f" ({run['samples_per_phase']} samples/phase)" if run.get("samples_per_phase") else "")
        fig.add_trace(go.Scatter(x=list(range(len(rewards))), y=rewards, mode="lines+markers", name=label,
                                 marker={"size": 4}, line={"color": colour}), row=1, col=1)
        for col, key in ((2, "wall_seconds"), (3, memory_key)):
            value = run.get(key)
            fig.add_trace(go.Bar(x=[name], y=[value], marker_color=colour, showlegend=False,
                                 text=[f"{value:.0f}" if value is not None else "n/a"], textposition="auto"),
                          row=1, col=col)
    fig.update_xaxes(title_text="phase", row=1, col=1)
    fig.update_yaxes(range=[0, 1.02], row=1, col=1)
    fig.update_layout(title=title, height=420, margin={"t": 100, "b": 110, "l": 50, "r": 20},
                      legend={"orientation": "h", "yanchor": "top", "y": -0.2, "x": 0})
    return fig


def truncation_text(truncated: Sequence[bool], rewards: Sequence[float], max_new_tokens: int) -> str:
    """One sentence: how many of the completions were truncated (no EOS within ``max_new_tokens``) and,
    when any were, the mean reward of those; when none were, it says so instead of a mean of nothing."""
    flags = [bool(t) for t in truncated]
    paid = [float(r) for r, t in zip(rewards, flags) if t]
    head = f"truncated (no EOS in {max_new_tokens} tokens): {len(paid)} of {len(flags)}"
    if not paid:
        return head + "; every completion ended with an EOS, so overlong filtering would mask none of them"
    return head + f"; their mean reward {sum(paid) / len(paid):.2f}"


def run_summary(reward_per_phase: Sequence[float], wall_seconds: float, peak_memory_mb: float,
                samples_per_phase: int | None = None) -> dict[str, Any]:
    """The dict :func:`comparison_figure` reads, for a run made in the notebook."""
    return {"reward_per_phase": list(reward_per_phase), "wall_seconds": wall_seconds,
            "peak_memory_mb": peak_memory_mb, "samples_per_phase": samples_per_phase}


def write_report(path: str | Path, summary: dict[str, Any], groups: Sequence[dict[str, Any]],
                 ppo_summary: dict[str, Any] | None = None) -> Path:
    """An HTML report of a ``train-grpo`` run: its curves, the PPO comparison when ``ppo_summary`` is
    given, and the group viewer of the last phase."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    history = [
        {"phase": i, "reward": r, "kl": k, "frac_reward_zero_std": z, "clip_active_frac": None}
        for i, (r, k, z) in enumerate(zip(summary["reward_per_phase"], summary["kl_per_phase"],
                                          summary["frac_reward_zero_std_per_phase"]))
    ]
    parts = [f"<h1>GRPO ({html.escape(str(summary.get('world')))}, {html.escape(str(summary.get('reward')))}, "
             f"seed {summary.get('seed')})</h1>",
             "<pre>" + html.escape("\n".join(f"{k}: {v}" for k, v in summary.items()
                                             if not isinstance(v, (list, dict)))) + "</pre>",
             grpo_curves(history).to_html(full_html=False, include_plotlyjs=True)]
    if ppo_summary is not None:
        fig = comparison_figure({"PPO": ppo_summary, "GRPO": summary})
        parts.append(fig.to_html(full_html=False, include_plotlyjs=False))
    parts.append("<h2>The groups of the last phase</h2>" + group_table(groups).html)
    path.write_text("<html><head><meta charset='utf-8'></head><body>" + "".join(parts) + "</body></html>")
    return path
