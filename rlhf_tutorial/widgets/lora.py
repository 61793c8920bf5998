"""Chapter 08's figures (plotly): GRPO's reward and KL per phase at each LoRA rank, what each rank trains
and keeps in the optimizer, SFT's pass@1 per rank, and the spectrum of a full fine-tune's weight change.
They draw numbers that ``trainers.lora_compare`` and ``lora.update_rank_profile`` computed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rlhf_tutorial.widgets.live import integer_ticks, significant


def _label(rank: int | str) -> str:
    return "full fine-tuning" if int(rank) == 0 else f"LoRA rank {rank}"


def _short_label(rank: int | str) -> str:
    return "full" if int(rank) == 0 else f"rank {rank}"


def _by_rank(runs: Mapping[str, Any]) -> dict[str, Any]:
    """``runs`` in reading order: full fine-tuning first, then the ranks from the largest down (a JSON
    summary's keys come sorted as strings: "0", "1", "16", "4")."""
    return dict(sorted(runs.items(), key=lambda item: (int(item[0]) != 0, -int(item[0]))))


# A log axis labelled at its powers of ten only (plotly's default also labels 2 and 5 in small type).
DECADES = dict(type="log", dtick=1)


def _colour(i: int) -> str:
    return f"hsl({(i * 137) % 360}, 60%, 45%)"


def rank_curves(runs: Mapping[str, Mapping[str, Any]], title: str = "GRPO on the sentiment task, by LoRA rank") -> go.Figure:
    """Two panels, one line per run (``compare-lora``'s records: ``reward_per_phase``, ``kl_per_phase``)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["mean reward of the phase's samples", "KL to the reference (per token)"])
    phases = []
    for i, (rank, record) in enumerate(_by_rank(runs).items()):
        for col, key in ((1, "reward_per_phase"), (2, "kl_per_phase")):
            ys = record[key]
            phases += range(1, len(ys) + 1)
            fig.add_trace(go.Scatter(x=list(range(1, len(ys) + 1)), y=ys, mode="lines+markers" if len(ys) < 5 else "lines",
                                     name=_label(rank), legendgroup=str(rank), showlegend=col == 1,
                                     line=dict(color=_colour(i))),
                          row=1, col=col)
            fig.update_xaxes(title_text="phase", row=1, col=col)
    fig.update_xaxes(**integer_ticks(phases))
    fig.add_hline(y=0.9, line_dash="dot", line_color="grey", row=1, col=1, annotation_text="0.9: the target",
                  annotation_position="top left", annotation_font_size=10)
    fig.update_layout(title=title, height=380, legend=dict(orientation="h", yanchor="top", y=-0.22),
                      margin=dict(b=90))
    return fig


def cost_figure(runs: Mapping[str, Mapping[str, Any]], sft: Mapping[str, Mapping[str, Any]] | None = None,
                seeds: Mapping[str, Mapping[str, Any]] | None = None) -> go.Figure:
    """Per rank: trained parameters (log axis), the optimizer's state (MB), GRPO's final mean reward and,
    with ``sft``, SFT's pass@1. With ``seeds`` (``compare-lora --seeds``' ``runs``: per rank
    ``mean_reward_final`` as ``mean``, ``min``, ``max``), the reward bar is the mean over the seeds with a
    bar from the lowest to the highest, and ``runs``' own reward is a marker on it: one seed is one draw."""
    seeded = seeds is not None and all(r in seeds for r in runs)
    reward_title = f"GRPO: final reward ({len(next(iter(seeds.values()))['mean_reward_final']['per_seed'])} seeds)" \
        if seeded else "GRPO: final reward"
    panels = ["trained parameters", "optimizer state (MB)", reward_title] + (["SFT: pass@1"] if sft else [])
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=panels, horizontal_spacing=0.07)
    order = list(_by_rank(runs))
    labels = [_short_label(r) for r in order]
    colours = [_colour(i) for i in range(len(order))]  # each rank its colour of rank_curves (the same order)
    values = [[runs[r]["trainable_parameters"] for r in order], [runs[r]["optimizer_state_mb"] for r in order],
              [runs[r]["mean_reward_final"] for r in order]]
    if sft:
        values.append([sft[r]["pass_at_1_final"] if r in sft else None for r in order])
    if seeded:
        spread = [seeds[r]["mean_reward_final"] for r in order]
        values[2] = [s["mean"] for s in spread]
    for col, ys in enumerate(values, start=1):
        text = [(f"{v:,.0f}" if col == 1 else significant(v)) if v is not None else "" for v in ys]
        bars = dict(error_y=dict(type="data", symmetric=False, array=[s["max"] - s["mean"] for s in spread],
                                 arrayminus=[s["mean"] - s["min"] for s in spread], thickness=1.2, width=4),
                    textposition="inside", insidetextanchor="start") if seeded and col == 3 else \
            dict(textposition="outside")
        fig.add_trace(go.Bar(x=labels, y=ys, marker_color=colours, showlegend=False, text=text, cliponaxis=False,
                             textfont=dict(size=10), **bars), row=1, col=col)
    if seeded:  # the runs' own rewards (seed 0), one draw each
        fig.add_trace(go.Scatter(x=labels, y=[runs[r]["mean_reward_final"] for r in order], mode="markers",
                                 name="seed 0 (the runs above)", marker=dict(symbol="diamond", size=9, color="black"),
                                 hovertemplate="seed 0: %{y:.2f}<extra></extra>"), row=1, col=3)
        fig.update_layout(legend=dict(orientation="h", x=1.0, xanchor="right", y=-0.12))
    fig.update_yaxes(**DECADES, row=1, col=1)
    fig.update_yaxes(**DECADES, row=1, col=2)
    fig.update_yaxes(range=[0, 1.1], row=1, col=3)
    if sft:
        fig.update_yaxes(range=[0, 1.1], row=1, col=4)
    fig.update_xaxes(tickangle=0, tickfont=dict(size=11))
    for annotation in fig.layout.annotations:  # the panels' titles, smaller: four fit side by side
        annotation.font.size = 13
    fig.update_layout(title="What each rank costs, and what it reaches", height=380)
    return fig


def spectrum_figure(spectra: Mapping[str, Any], ks: Mapping[str, tuple[int, int]], random: Any | None = None,
                    title: str = "") -> go.Figure:
    """Left: the share of each weight change's squared norm carried by its top k singular directions
    (one line per matrix; ``spectra`` maps a name to its singular values, largest first), with a
    Gaussian matrix's for comparison (``random``). Right: ``ks[name]`` = (k for 50%, k for 90%), as
    ``update_rank_profile`` counted them."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["share of ||change||² in the top k directions",
                                                         "directions needed per matrix"])
    ks50, ks90, names = [], [], []
    for i, (name, values) in enumerate(spectra.items()):
        energy = [float(v) ** 2 for v in values]
        total = sum(energy) or 1.0
        running, shares = 0.0, []
        for e in energy:
            running += e
            shares.append(running / total)
        fig.add_trace(go.Scatter(x=list(range(1, len(shares) + 1)), y=shares, mode="lines", name=name,
                                 line=dict(color=_colour(i), width=1), showlegend=False), row=1, col=1)
        names.append(name)
        ks50.append(ks[name][0])
        ks90.append(ks[name][1])
    if random is not None:
        energy = [float(v) ** 2 for v in random]
        total, running, shares = sum(energy), 0.0, []
        for e in energy:
            running += e
            shares.append(running / total)
        fig.add_trace(go.Scatter(x=list(range(1, len(shares) + 1)), y=shares, mode="lines", name="a Gaussian matrix",
                                 line=dict(color="black", dash="dash")), row=1, col=1)
    fig.add_trace(go.Bar(x=names, y=ks50, name="k for 50%"), row=1, col=2)
    fig.add_trace(go.Bar(x=names, y=ks90, name="k for 90%"), row=1, col=2)
    fig.update_xaxes(title_text="k (singular directions)", **DECADES, row=1, col=1)
    fig.update_yaxes(range=[0, 1.02], row=1, col=1)
    fig.update_layout(title=title or "How many directions a full fine-tune moved", height=420, barmode="group",
                      legend=dict(orientation="h", yanchor="top", y=-0.3), margin=dict(b=110, r=60))  # room for the last tilted name
    return fig
