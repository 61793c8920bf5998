"""Chapter 06 visuals: DPO's training curves (live or static) and the reward-KL frontier.

- :func:`dpo_dashboard`: a ``LiveDashboard`` of the DPO trainer's rounds (loss, implicit reward margin,
  pair accuracy, held-out reward, sequence KL) and the callback that feeds it; static where no widget
  front end is available (nbval, a terminal, ``RLHF_TUTORIAL_STATIC=1``).
- :func:`frontier_figure`: every point of a sweep on the plane of mean reward against sequence
  KL(policy || ref), error bars of one standard error on both axes; click a legend entry to hide or
  show a method (double-click: only that one), the buttons pick groups of methods, hover a point for
  its settings and samples.
- :func:`cost_figure`: training wall time and peak memory per method.
- :class:`FrontierTable`: every point as an HTML table (notebook, report) or text (terminal): the
  static fallback of the figure.
- :func:`write_report` (``train-dpo --report``), :func:`write_frontier_report` (``frontier``).
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rlhf_tutorial.widgets.live import LiveDashboard, significant

COLOURS = {"ppo": "#1f77b4", "grpo": "#d62728", "rloo": "#ff7f0e", "gspo": "#9467bd", "dpo": "#2ca02c",
           "ipo": "#17becf", "kto": "#8c564b", "orpo": "#e377c2", "reinforce_pp": "#bcbd22", "cispo": "#7f7f7f",
           "base": "#444444"}
LABELS = {"ppo": "PPO (ch. 03)", "grpo": "GRPO (ch. 04)", "rloo": "GRPO + RLOO adv.", "gspo": "GSPO", "dpo": "DPO", "ipo": "IPO",
          "reinforce_pp": "REINFORCE++", "cispo": "CISPO", "kto": "KTO", "orpo": "ORPO", "base": "base policy"}
DPO_PANELS = ["loss", "margin", "accuracy", "reward", "kl"]
DPO_TITLES = {"loss": "DPO loss (train pairs)", "margin": "implicit reward margin", "accuracy": "pair accuracy",
              "reward": "held-out classifier reward", "kl": "sequence KL(policy || ref)"}


# ----------------------------------------------------------------------------------------------------
# DPO curves
# ----------------------------------------------------------------------------------------------------


def dpo_dashboard(title: str = "DPO", static: bool | None = None) -> tuple[LiveDashboard, Callable[[dict], None]]:
    """A dashboard of DPO's rounds and the ``callback`` for ``dpo_trainer.train``; call
    ``dash.finish()`` after training."""
    dash = LiveDashboard(DPO_PANELS, title=title, titles=DPO_TITLES, x_title="round", cols=5, static=static,
                         height_per_row=250)

    def callback(record: dict[str, Any]) -> None:
        dash.update(record["round"], **{k: record.get(k) for k in DPO_PANELS})
        if record.get("samples"):
            text, reward = record["samples"][0]
            dash.note(f"round {record['round']}: {reward:.2f} {text!r}")

    return dash, callback


def dpo_curves(history: Sequence[dict[str, Any]], title: str = "DPO") -> go.Figure:
    """The same five panels as a static figure, from a finished run's history."""
    dash, callback = dpo_dashboard(title, static=True)
    for record in history:
        callback(record)
    return dash.to_figure()


# ----------------------------------------------------------------------------------------------------
# The frontier
# ----------------------------------------------------------------------------------------------------


def _hover(point: dict[str, Any]) -> str:
    settings = point.get("settings") or {}
    keys = [k for k in ("learning_rate", "num_phases", "rounds", "loss_type",
                        "advantage_estimator", "importance_level", "num_pairs") if k in settings]
    lines = [f"<b>{LABELS.get(point['method'], point['method'])}</b> {point.get('strength_name', 'kl_coef')} = "
             f"{point.get('strength', '')}",
             f"reward {point['reward']:.3f} ± {point['reward_se']:.3f}, KL {point['kl']:.2f} ± {point['kl_se']:.2f} nats",
             f"train {point.get('train_seconds', 0):.0f} s"]
    lines += [f"{k} = {settings[k]}" for k in keys]
    for text, reward in point.get("samples", [])[:3]:
        lines.append(f"{reward:.2f} {html.escape(text[:90])}")
    return "<br>".join(lines)


# Where a point's label (its strength) may go, in the order tried: plotly's text positions around a marker.
LABEL_POSITIONS = ("top center", "bottom center", "middle right", "middle left",
                   "top right", "top left", "bottom right", "bottom left")
# The frontier's plot area as the notebook shows it (pixels, about: the page's width less the legend),
# the marker's half size and a label's size per character, for placing labels apart.
PLOT_PX = (700.0, 330.0)
MARKER_PX = 6.0
CHAR_PX, LABEL_HEIGHT_PX = 6.0, 12.0


def _label_box(x: float, y: float, text: str, position: str) -> tuple[float, float, float, float]:
    """The box (left, top, right, bottom; pixels) of ``text`` placed at ``position`` around a marker at x, y."""
    w, h = CHAR_PX * len(text) + 2, LABEL_HEIGHT_PX
    vertical, horizontal = position.split()
    cx = {"center": x, "right": x + MARKER_PX + w / 2, "left": x - MARKER_PX - w / 2}[horizontal]
    cy = {"middle": y, "top": y - MARKER_PX - h / 2, "bottom": y + MARKER_PX + h / 2}[vertical]
    if vertical != "middle" and horizontal != "center":  # diagonal: plotly starts the text at the marker's edge
        cx -= (MARKER_PX if horizontal == "right" else -MARKER_PX)
    return cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2


def _overlap(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))


def label_positions(xy: Sequence[tuple[float, float]], texts: Sequence[str], markers: Sequence[tuple[float, float]] = (),
                    x_range: tuple[float, float] | None = None, y_range: tuple[float, float] = (0.0, 1.05),
                    plot_px: tuple[float, float] = PLOT_PX,
                    errors: Sequence[tuple[float, float]] = ()) -> list[str]:
    """A text position (``LABEL_POSITIONS``) for each point's label, chosen greedily so that labels cover
    neither each other nor any marker (``xy`` and the other ``markers``, e.g. the base policy's) nor the
    points' error bars (``errors``: (x, y) half-widths per point of ``xy``): each label takes the first
    position with the least overlap (in pixels of a ``plot_px`` plot area) with those and the labels
    placed before it. Points at the same place get labels on different sides."""
    everything = list(xy) + list(markers)
    if x_range is None:
        xs = [x for x, _ in everything] or [0.0]
        pad = 0.05 * ((max(xs) - min(xs)) or 1.0)
        x_range = (min(xs) - pad, max(xs) + pad)
    width, height = plot_px

    def px(x: float, y: float) -> tuple[float, float]:
        return ((x - x_range[0]) / ((x_range[1] - x_range[0]) or 1.0) * width,
                (y_range[1] - y) / ((y_range[1] - y_range[0]) or 1.0) * height)

    taken = [(mx - MARKER_PX, my - MARKER_PX, mx + MARKER_PX, my + MARKER_PX) for mx, my in (px(*m) for m in everything)]
    for (x, y), (dx, dy) in zip(xy, errors):  # error bars: thin boxes (a bar counts less than a label)
        (left, top), (right, bottom) = px(x - dx, y + dy), px(x + dx, y - dy)
        cx, cy = px(x, y)
        taken += [(cx - 1, top, cx + 1, bottom), (left, cy - 1, right, cy + 1)]
    chosen = []
    for (x, y), text in zip(xy, texts):
        boxes = {pos: _label_box(*px(x, y), text, pos) for pos in LABEL_POSITIONS}
        best = min(LABEL_POSITIONS, key=lambda pos: (sum(_overlap(boxes[pos], t) for t in taken),
                                                    LABEL_POSITIONS.index(pos)))
        chosen.append(best)
        taken.append(boxes[best])
    return chosen


def frontier_figure(result: dict[str, Any], title: str = "Reward against KL(policy || ref)") -> go.Figure:
    """One trace per method (points sorted by KL, joined by a faint line) and the base policy. Each point's
    label is its strength, in its method's colour, placed beside the point where it covers no other label
    or marker (:func:`label_positions`); hover a point for the rest."""
    fig = go.Figure()
    methods = list(dict.fromkeys(p["method"] for p in result["points"]))
    by_method = {m: sorted((p for p in result["points"] if p["method"] == m), key=lambda p: p["kl"]) for m in methods}
    ordered = [p for m in methods for p in by_method[m]]
    base = result.get("base")
    kls = [v for p in ordered for v in (p["kl"] - p.get("kl_se", 0.0), p["kl"] + p.get("kl_se", 0.0))]
    kls += [base["kl"]] if base else []
    pad = 0.05 * ((max(kls) - min(kls)) or 1.0) if kls else 0.05
    positions = label_positions([(p["kl"], p["reward"]) for p in ordered], [f"{p['strength']:g}" for p in ordered],
                                markers=[(base["kl"], base["reward"])] if base else [],
                                errors=[(p.get("kl_se", 0.0), p.get("reward_se", 0.0)) for p in ordered],
                                x_range=(min(kls, default=0.0) - pad, max(kls, default=1.0) + pad))
    where = {id(p): pos for p, pos in zip(ordered, positions)}
    for method in methods:
        pts = by_method[method]
        fig.add_trace(go.Scatter(
            x=[p["kl"] for p in pts], y=[p["reward"] for p in pts], mode="lines+markers+text",
            name=LABELS.get(method, method), marker={"size": 10, "color": COLOURS.get(method)},
            line={"color": COLOURS.get(method), "width": 1, "dash": "dot"},
            text=[f"{p['strength']:g}" for p in pts], textposition=[where[id(p)] for p in pts],
            textfont={"size": 10, "color": COLOURS.get(method)},
            error_x={"type": "data", "array": [p["kl_se"] for p in pts], "thickness": 1},
            error_y={"type": "data", "array": [p["reward_se"] for p in pts], "thickness": 1},
            hovertext=[_hover(p) for p in pts], hoverinfo="text",
        ))
    if result.get("base"):
        b = result["base"]
        fig.add_trace(go.Scatter(x=[b["kl"]], y=[b["reward"]], mode="markers", name=LABELS["base"],
                                 marker={"size": 12, "symbol": "x", "color": COLOURS["base"]},
                                 error_y={"type": "data", "array": [b["reward_se"]], "thickness": 1},
                                 hovertext=[_hover({**b, "method": "base", "strength_name": "", "strength": ""})],
                                 hoverinfo="text"))
    rl = ("ppo", "grpo", "rloo", "gspo", "reinforce_pp", "cispo")
    groups = {"all": methods, "RL (" + ", ".join(LABELS[m].split(" (")[0] for m in rl if m in methods) + ")":
              [m for m in methods if m in rl],
              "preferences (DPO, IPO, KTO, ORPO)": [m for m in methods if m in ("dpo", "ipo", "kto", "orpo")]}
    names = methods + (["base"] if result.get("base") else [])
    buttons = [dict(label=label, method="restyle",
                    args=[{"visible": [m in chosen or m == "base" for m in names]}])
               for label, chosen in groups.items() if chosen]
    fig.update_layout(
        title=title, height=520, template="plotly_white",
        xaxis_title="KL(policy || ref) per sequence, nats (from the policy's own samples)",
        yaxis_title="mean classifier reward", yaxis={"range": [0, 1.05]},
        updatemenus=[dict(type="buttons", direction="right", x=0.0, y=1.12, xanchor="left", buttons=buttons)],
        legend={"title": "click: hide/show; double-click: only"},
        margin={"t": 110},
    )
    return fig


def cost_figure(result: dict[str, Any]) -> go.Figure:
    """Training wall time (all points of a method together) and peak memory (largest of its runs), each bar
    labelled with two significant digits (a DPO run of 0.3 s reads "0.3", not "0")."""
    methods = list(result["methods"])
    fig = make_subplots(rows=1, cols=2, subplot_titles=["training wall time, all points (s)",
                                                        "peak memory above the start of a run (MB)"])
    colours = [COLOURS.get(m) for m in methods]
    labels = [LABELS.get(m, m) for m in methods]
    for col, key in ((1, "train_seconds"), (2, "peak_memory_mb")):
        values = [result["methods"][m][key] for m in methods]
        fig.add_trace(go.Bar(x=labels, y=values, marker_color=colours, showlegend=False,
                             text=[significant(v) for v in values], textposition="auto"), row=1, col=col)
    fig.update_layout(height=320, template="plotly_white", margin={"t": 50, "b": 40})
    return fig


class FrontierTable:
    """Every point of a sweep; HTML in a notebook or report, text in a terminal."""

    def __init__(self, result: dict[str, Any]):
        self.result = result

    def rows(self) -> list[tuple[str, ...]]:
        out = []
        if self.result.get("base"):
            b = self.result["base"]
            out.append(("base", "", f"{b['reward']:.3f} ± {b['reward_se']:.3f}", f"{b['kl']:.2f} ± {b['kl_se']:.2f}",
                        "", "", b["samples"][0][0] if b.get("samples") else ""))
        for p in self.result["points"]:
            out.append((LABELS.get(p["method"], p["method"]), f"{p['strength_name']} = {p['strength']:g}",
                        f"{p['reward']:.3f} ± {p['reward_se']:.3f}", f"{p['kl']:.2f} ± {p['kl_se']:.2f}",
                        f"{p['train_seconds']:.0f}", f"{p['peak_memory_mb']:.0f}",
                        p["samples"][0][0] if p.get("samples") else ""))
        return out

    HEAD = ("method", "strength", "reward ± se", "KL (nats) ± se", "train s", "peak MB", "a sample")

    def __str__(self) -> str:
        return "\n".join(" | ".join(row) for row in [self.HEAD, *self.rows()])

    def _repr_html_(self) -> str:
        head = "".join(f"<th style='text-align:left;padding:2px 8px'>{h}</th>" for h in self.HEAD)
        body = "".join("<tr>" + "".join(f"<td style='padding:2px 8px'>{html.escape(c)}</td>" for c in row) + "</tr>"
                       for row in self.rows())
        return f"<table style='font-family:monospace;font-size:90%'><tr>{head}</tr>{body}</table>"


# ----------------------------------------------------------------------------------------------------
# Reports
# ----------------------------------------------------------------------------------------------------


def _page(parts: list[str]) -> str:
    return "<html><head><meta charset='utf-8'></head><body style='font-family:sans-serif'>" + "".join(parts) + "</body></html>"


def _scalars(summary: dict[str, Any]) -> str:
    return "<pre>" + html.escape("\n".join(f"{k}: {v}" for k, v in summary.items()
                                           if not isinstance(v, (list, dict)))) + "</pre>"


def write_report(path: str | Path, summary: dict[str, Any], history: Sequence[dict[str, Any]]) -> Path:
    """An HTML report of a ``train-dpo`` run: the summary, the curves, samples before and after."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    samples = "".join(f"<li><b>{name}</b>: {html.escape(t)}</li>" for name in ("initial", "final")
                      for t in summary.get(f"samples_{name}", []))
    parts = [f"<h1>DPO ({html.escape(str(summary.get('world')))}, {summary.get('loss_type')}, beta {summary.get('beta')}, "
             f"seed {summary.get('seed')})</h1>", _scalars(summary),
             dpo_curves(history).to_html(full_html=False, include_plotlyjs=True), f"<h2>Samples</h2><ul>{samples}</ul>"]
    path.write_text(_page(parts))
    return path


def write_frontier_report(path: str | Path, result: dict[str, Any]) -> Path:
    """An HTML report of a ``frontier`` sweep: the interactive frontier, the costs, the table of points."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    parts = [f"<h1>Reward-KL frontier ({html.escape(str(result.get('world')))} world)</h1>",
             "<p>Each point: a run from the same starting policy and seed; mean classifier reward and sequence "
             "KL(policy || ref) measured on the tuned policy's own samples (the same sampler and samples count for "
             "every method), error bars one standard error. Numbers beside the points: the KL strength.</p>",
             frontier_figure(result).to_html(full_html=False, include_plotlyjs=True),
             cost_figure(result).to_html(full_html=False, include_plotlyjs=False),
             "<h2>Every point</h2>", FrontierTable(result)._repr_html_(),
             _scalars({k: v for k, v in result.items() if k not in ("points", "methods", "base")})]
    path.write_text(_page(parts))
    return path
