"""Chapter 05 visuals: lenses, attributions, patching, weight change, the activation-difference lens.

Every function returns a plotly figure, or an object with an HTML form, that renders with no kernel
(the figures carry plotly.js's own dropdowns and hover text, so a saved notebook or the HTML report
keeps them). Where ipywidgets can show (JupyterLab), :func:`lens_explorer` and :func:`steering_explorer`
return live widgets instead; ``static=True`` forces the static form.

- :func:`lens_figure` / :func:`lens_explorer`: layer x position heatmaps of the logit lens or the value
  lens, base | tuned | difference, one sample at a time (a sample picker);
- :func:`attribution_figure`: layer x head direct logit attribution, base | tuned | difference, plus
  the other components (attention biases, MLPs, embedding) as bars;
- :func:`patching_figure`: the restored fraction per layer x component, per layer x head and per
  layer x position;
- :func:`param_change_figure`: relative change of every weight matrix, grouped by layer;
- :func:`steering_view` / :func:`steering_explorer`: the lens's top tokens and base samples before and
  after steering with it.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rlhf_tutorial.display import HTMLText, widgets_available
from rlhf_tutorial.widgets.live import Explorer, with_text
from rlhf_tutorial.widgets.rlhf import _samples_html, _samples_text

LENSES = {"logit": "logit lens: ln_pre(resid) @ direction", "value": "value lens: value_head(ln_pre(resid))"}


def _static(static: bool | None) -> bool:
    return (not widgets_available()) if static is None else static


#: Where the two colour bars stand: base and tuned share the one right of the tuned panel, the difference
#: has its own. With the panels' spacing below, neither touches the next panel's tick labels.
_SHARED_SCALE_X, _DIFF_SCALE_X = 0.63, 1.01


def _three_panels(title: str, x_title: str, y_title: str, height: int = 320) -> go.Figure:
    """base | tuned | tuned - base, one row. The three panels share their y axis (layers or heads), so
    only the first carries its title and tick labels: repeated ones would sit on the colour bars."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=["base", "tuned", "tuned - base"], horizontal_spacing=0.14)
    fig.update_layout(title=title, height=height, template="plotly_white", margin=dict(l=60, r=40, t=80, b=50))
    for col in (1, 2, 3):
        fig.update_xaxes(title_text=x_title, row=1, col=col)
        fig.update_yaxes(title_text=y_title if col == 1 else None, showticklabels=col == 1, row=1, col=col)
    return fig


def _heat(z, x, y, zmax: float, colourbar_x: float, hover: str, show_scale: bool) -> go.Heatmap:
    return go.Heatmap(z=z, x=x, y=y, zmin=-zmax, zmax=zmax, colorscale="RdBu_r", hovertemplate=hover,
                      showscale=show_scale, colorbar=dict(x=colourbar_x, len=0.9, thickness=12))


# ----------------------------------------------------------------------------------------------------
# Lenses: layer x position, base | tuned | difference, per sample
# ----------------------------------------------------------------------------------------------------
def _lens_traces(record: dict[str, Any], lens: str) -> list[go.Heatmap]:
    base, tuned = record[f"{lens}_base"], record[f"{lens}_tuned"]
    diff = [[t - b for b, t in zip(rb, rt)] for rb, rt in zip(base, tuned)]
    x = [f"{i}:{tok}" for i, tok in enumerate(record["tokens"])]
    y = record["layers"]
    zmax = max(1e-6, max(abs(v) for row in base + tuned for v in row))
    dmax = max(1e-6, max(abs(v) for row in diff for v in row))
    hover = "layer %{y}<br>token %{x}<br>%{z:.4f}<extra></extra>"
    return [_heat(base, x, y, zmax, _SHARED_SCALE_X, hover, False),
            _heat(tuned, x, y, zmax, _SHARED_SCALE_X, hover, True), _heat(diff, x, y, dmax, _DIFF_SCALE_X, hover, True)]


def lens_figure(records: Sequence[dict[str, Any]], lens: str = "logit") -> go.Figure:
    """Heatmaps (layer x position) of one lens for every sample, base | tuned | difference; the figure's
    own dropdown picks the sample (works with no kernel). ``records[i]`` holds ``tokens``, ``layers`` and
    ``{lens}_base`` / ``{lens}_tuned`` as [layer][position] lists (``interp_report.lens_records``)."""
    fig = _three_panels(LENSES[lens], "position: token", "residual stream at")
    for i, record in enumerate(records):
        for col, trace in enumerate(_lens_traces(record, lens), start=1):
            trace.visible = i == 0
            fig.add_trace(trace, row=1, col=col)
    if len(records) > 1:
        buttons = [dict(label=f"{i}: {r['text'][:40]}", method="update",
                        args=[{"visible": [j // 3 == i for j in range(3 * len(records))]}])
                   for i, r in enumerate(records)]
        # top right, above the subplot titles (at the top left it sat on the "base" title)
        fig.update_layout(updatemenus=[dict(buttons=buttons, x=1.0, y=1.4, xanchor="right", yanchor="bottom",
                                            showactive=True)], margin=dict(t=120))
    return fig


def lens_explorer(records: Sequence[dict[str, Any]], static: bool | None = None):
    """The logit lens and the value lens side by side for base and tuned, a sample at a time. Live:
    a sample dropdown and lens buttons redraw the figure (an :class:`Explorer`, so a reopened notebook
    shows the last view from its saved widget state). Static: both lens figures (with their own sample
    dropdowns)."""
    if _static(static):
        return StaticFigures([lens_figure(records, "logit"), lens_figure(records, "value")],
                             "\n\n".join(lens_text([r], lens) for r in records for lens in LENSES))
    import ipywidgets as widgets

    pick = widgets.Dropdown(options=[(f"{i}: {r['text'][:60]}", i) for i, r in enumerate(records)], value=0,
                            description="sample", layout=widgets.Layout(width="70%"))
    lens = widgets.ToggleButtons(options=[("logit lens", "logit"), ("value lens", "value")], value="logit")
    return Explorer([pick, lens], lambda: lens_figure([records[pick.value]], lens.value),
                    text=lambda: "\n\n".join(lens_text(records, name) for name in LENSES))


def lens_text(records: Sequence[dict[str, Any]], lens: str = "logit") -> str:
    """The numbers of :func:`lens_figure` as plain text: per sample, one row per layer and one column per
    token, for base, tuned and tuned - base."""
    blocks = []
    for record in records:
        tokens = [repr(t)[1:-1][:8] for t in record["tokens"]]
        width = max(8, *(len(t) for t in tokens))
        head = f"{'':>12} " + " ".join(f"{t:>{width}}" for t in tokens)
        lines = [f"{LENSES[lens]} -- {record['text']!r}"]
        base, tuned = record[f"{lens}_base"], record[f"{lens}_tuned"]
        diff = [[t - b for b, t in zip(rb, rt)] for rb, rt in zip(base, tuned)]
        for name, rows in (("base", base), ("tuned", tuned), ("tuned - base", diff)):
            lines += [f"  {name}", head]
            lines += [f"{layer:>12} " + " ".join(f"{v:>{width}.3f}" for v in row) for layer, row in zip(record["layers"], rows)]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


class StaticFigures:
    """Several plotly figures shown one after the other (in a notebook: each with plotly.js)."""

    def __init__(self, figures: Sequence[go.Figure], text: str | None = None):
        self.figures = list(figures)
        self.text = text

    def _ipython_display_(self) -> None:
        from IPython.display import display

        for fig in self.figures:
            display(fig)

    def __repr__(self) -> str:
        return self.text if self.text is not None else f"StaticFigures({len(self.figures)} figures)"


# ----------------------------------------------------------------------------------------------------
# Direct logit attribution
# ----------------------------------------------------------------------------------------------------
def attribution_figure(base: dict[str, Any], tuned: dict[str, Any]) -> go.Figure:
    """Layer x head attributions, base | tuned | difference (hover: exact numbers), and under them the
    other components of each model as bars: per-layer attention bias and MLP, and the embedding.
    ``base`` / ``tuned`` are ``interp.component_attributions`` outputs (tensors or lists)."""
    heads_b, heads_t = _as_list(base["heads"]), _as_list(tuned["heads"])
    diff = [[t - b for b, t in zip(rb, rt)] for rb, rt in zip(heads_b, heads_t)]
    n_layers, n_heads = len(heads_b), len(heads_b[0])
    fig = make_subplots(rows=2, cols=3, row_heights=[0.55, 0.45], vertical_spacing=0.2, horizontal_spacing=0.09,
                        subplot_titles=["heads: base", "heads: tuned", "heads: tuned - base",
                                        "other components (base vs tuned)", "", ""],
                        specs=[[{}, {}, {}], [{"colspan": 3}, None, None]])
    x, y = [f"H{h}" for h in range(n_heads)], [f"L{la}" for la in range(n_layers)]
    zmax = max(1e-6, max(abs(v) for row in heads_b + heads_t for v in row))
    dmax = max(1e-6, max(abs(v) for row in diff for v in row))
    hover = "%{y}.%{x}: %{z:.4f}<extra></extra>"
    fig.add_trace(_heat(heads_b, x, y, zmax, _SHARED_SCALE_X, hover, False), row=1, col=1)
    fig.add_trace(_heat(heads_t, x, y, zmax, _SHARED_SCALE_X, hover, True), row=1, col=2)
    fig.add_trace(_heat(diff, x, y, dmax, _DIFF_SCALE_X, hover, True), row=1, col=3)
    for trace in fig.data:
        trace.colorbar.update(len=0.45, y=0.78)
    names = [f"attn bias L{la}" for la in range(n_layers)] + [f"MLP L{la}" for la in range(n_layers)] + ["embed"]
    for label, parts, colour in [("base", base, "#1f77b4"), ("tuned", tuned, "#d62728")]:
        values = _as_list(parts["attn_bias"]) + _as_list(parts["mlp"]) + [float(parts["embed"])]
        fig.add_trace(go.Bar(x=names, y=values, name=label, marker_color=colour,
                             hovertemplate="%{x}: %{y:.4f}<extra>" + label + "</extra>"), row=2, col=1)
    fig.update_layout(title="direct logit attribution to the sentiment direction (mean over prompts)",
                      height=620, template="plotly_white", barmode="group", margin=dict(l=60, r=20, t=80, b=40),
                      legend=dict(orientation="h", y=-0.12))
    return fig


def _as_list(x: Any) -> Any:
    return x.tolist() if hasattr(x, "tolist") else x


# ----------------------------------------------------------------------------------------------------
# Activation patching
# ----------------------------------------------------------------------------------------------------
def patching_figure(sweep: dict[str, Any], components: Sequence[str], position_labels: Sequence[str]) -> go.Figure:
    """The restored fraction of the sentiment shift when one activation of the tuned model is patched
    into the base model: per layer x component (every position), per layer x head, and per
    layer x position (the residual stream at one position). 1 = all of the shift restored."""
    by_comp, by_head, by_pos = (_as_list(sweep[k]) for k in ("by_component", "by_head", "by_position"))
    n_layers = len(by_comp)
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.1, column_widths=[0.3, 0.3, 0.4],
                        subplot_titles=["per component (all positions)", "per head (z, all positions)",
                                        "residual stream at one position"])
    layers = [f"L{la}" for la in range(n_layers)]
    pos_rows = [f"resid_pre L{la}" for la in range(n_layers)] + [f"resid_post L{n_layers - 1}"]
    hover = "%{y} / %{x}: restored %{z:.3f}<extra></extra>"
    common = dict(zmin=-1, zmax=1, colorscale="RdBu_r", hovertemplate=hover)
    fig.add_trace(go.Heatmap(z=by_comp, x=list(components), y=layers, showscale=False,
                             text=[[f"{v:.2f}" for v in row] for row in by_comp], texttemplate="%{text}", **common),
                  row=1, col=1)
    fig.add_trace(go.Heatmap(z=by_head, x=[f"H{h}" for h in range(len(by_head[0]))], y=layers, showscale=False,
                             text=[[f"{v:.2f}" for v in row] for row in by_head], texttemplate="%{text}", **common),
                  row=1, col=2)
    fig.add_trace(go.Heatmap(z=by_pos, x=list(position_labels), y=pos_rows,
                             text=[[f"{v:.2f}" for v in row] for row in by_pos], texttemplate="%{text}",
                             colorbar=dict(title="restored", thickness=12), **common), row=1, col=3)
    fig.update_layout(title="activation patching, tuned -> base: fraction of the sentiment shift restored",
                      height=max(300, 90 + 40 * (n_layers + 1)), template="plotly_white",
                      margin=dict(l=100, r=20, t=80, b=60))
    return fig


# ----------------------------------------------------------------------------------------------------
# Weight change
# ----------------------------------------------------------------------------------------------------
def param_change_figure(changes: dict[str, float], fraction: dict[str, float] | None = None) -> go.Figure:
    """Bars of the relative change ``||tuned - base|| / ||base||`` of every parameter, grouped by layer
    (x: the layer or 'embed' / 'unembed'; one bar per matrix kind). ``fraction`` (e.g. {"fp32": ..,
    "bf16": ..}) goes into the title."""
    groups: dict[str, dict[str, float]] = {}
    for name, value in changes.items():
        parts = name.split(".")
        where = f"L{parts[1]}" if parts[0] == "blocks" else ("unembed" if "U" in parts[-1] else "embed")
        kind = ".".join(parts[2:]) if parts[0] == "blocks" else parts[-1]
        groups.setdefault(kind, {})[where] = value
    order = sorted({w for g in groups.values() for w in g}, key=lambda w: (w != "embed", w == "unembed", w))
    fig = go.Figure()
    for kind, values in groups.items():
        fig.add_trace(go.Bar(x=order, y=[values.get(w) for w in order], name=kind,
                             hovertemplate=kind + " %{x}: %{y:.3g}<extra></extra>"))
    title = "relative change ||tuned - base|| / ||base|| per parameter"
    if fraction:
        title += "<br><sub>entries changed: " + ", ".join(f"{k} {v:.1%}" for k, v in fraction.items()) + "</sub>"
    fig.update_layout(title=title, barmode="group", height=420, template="plotly_white",
                      yaxis=dict(title="relative change", type="log"), margin=dict(l=60, r=20, t=80, b=40))
    return fig


# ----------------------------------------------------------------------------------------------------
# The activation-difference lens and steering
# ----------------------------------------------------------------------------------------------------
def _tokens_html(top: Sequence[tuple[str, float]], bottom: Sequence[tuple[str, float]]) -> str:
    def cells(items, colour):
        return "".join(f"<span style='background:{colour};margin:2px;padding:1px 4px;border-radius:3px;"
                       f"font-family:monospace' title='{v:+.3f}'>{html.escape(t)}</span>" for t, v in items)

    return (f"<div style='font-family:sans-serif'><b>top tokens</b> (tuned - base, read through W_U): "
            f"{cells(top, '#fde0dd')}</div><div style='font-family:sans-serif;margin-top:4px'><b>bottom tokens"
            f"</b>: {cells(bottom, '#deebf7')}</div>")


def steering_view(top: Sequence[tuple[str, float]], bottom: Sequence[tuple[str, float]],
                  before: Sequence[tuple[str, float]], after: Sequence[tuple[str, float]], coef: float) -> HTMLText:
    """The lens's top and bottom tokens, and base samples (text, reward) without and with steering."""
    mean = lambda rows: sum(r for _, r in rows) / max(len(rows), 1)  # noqa: E731
    titles = (f"base model: mean reward {mean(before):.3f}", f"base + {coef:g} x lens: mean reward {mean(after):.3f}")
    page = (_tokens_html(top, bottom) + "<table><tr>" + "".join(
        f"<td style='vertical-align:top;padding:4px'>{_samples_html(rows, t)}</td>"
        for rows, t in zip((before, after), titles)) + "</tr></table>")
    text = ("top tokens: " + ", ".join(t for t, _ in top) + "\nbottom tokens: " + ", ".join(t for t, _ in bottom)
            + "\n\n" + _samples_text(before, titles[0]) + "\n\n" + _samples_text(after, titles[1]))
    return HTMLText(page, text)


def steering_explorer(top, bottom, sample: Callable[[float], list[tuple[str, float]]], coef: float,
                      static: bool | None = None):
    """:func:`steering_view` for ``coef``; live, a slider re-samples the base model steered with another
    coefficient (``sample(coef) -> [(text, reward)]``; 0 is the unsteered base model)."""
    before, after = sample(0.0), sample(coef)
    view = steering_view(top, bottom, before, after, coef)
    if _static(static):
        return view
    import ipywidgets as widgets

    slider = widgets.FloatSlider(value=coef, min=-2 * abs(coef) or -1, max=2 * abs(coef) or 1, step=abs(coef) / 10 or 0.1,
                                 description="coef", continuous_update=False)
    out = widgets.HTML(view.html)
    slider.observe(lambda change: setattr(out, "value", steering_view(top, bottom, before, sample(change["new"]),
                                                                       change["new"]).html), names="value")
    return with_text(widgets.VBox([slider, out]), view.plain)  # the numbers where no widget can be drawn
