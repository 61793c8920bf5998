"""How every course visual reaches the notebook: outputs redrawn in place, and the live training dashboard.

Every visual must still show when the notebook is reopened with no kernel. Two ways, one per kind:

- A visual that is finished when its cell ends (training curves, a figure) leaves an ordinary output:
  a plotly figure (JupyterLab adds a PNG snapshot to it when it draws it, which GitHub shows). While
  it changes, it is a live ``FigureWidget``; :class:`Updatable` replaces it by the static figure at the
  end (``LiveDashboard.finish()`` does this; ``show_updatable(obj).update(new)`` for anything else).
- An :class:`Explorer` (controls above views that redraw) stays live while the kernel runs; it is made
  of plain ipywidgets only (no FigureWidget: its saved state would carry 5 MB of JavaScript), so the
  widget state JupyterLab saves with the notebook (``make lab`` turns saving on) brings it back.

And the dashboard, reused by every chapter that trains something::

    dash = LiveDashboard(["episodic_return", "value_loss", ("reward", "kl")], title="PPO")
    for step in ...:
        dash.update(step, episodic_return=..., value_loss=..., reward=..., kl=...)
    dash.finish()

In JupyterLab its plotly figure redraws while the cell runs (at most every ``refresh_seconds``); the
last drawing stays in the saved notebook. Where nothing can be redrawn (a terminal, nbval,
``RLHF_TUTORIAL_STATIC=1`` or ``RLHF_TUTORIAL_STRICT=1``), nothing is drawn during training and
``finish()`` shows one static plotly figure instead (in a kernel; in a terminal it shows nothing:
``save(path)`` writes an HTML file). Every figure uses the course's plotly template, ``COURSE_TEMPLATE``.
"""

from __future__ import annotations

import html
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from rlhf_tutorial.display import in_kernel, widgets_available

# One template for every figure of the course: white background, the same font, room for titles.
COURSE_TEMPLATE = "plotly_white+rlhf_tutorial"
pio.templates["rlhf_tutorial"] = go.layout.Template(layout=dict(
    font=dict(size=12),
    title=dict(font=dict(size=16), x=0.01, xanchor="left"),
    margin=dict(l=60, r=30, t=80, b=60),
    colorway=["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"],
))
pio.templates.default = COURSE_TEMPLATE


# ----------------------------------------------------------------------------------------------------
# Numbers and axes as every figure shows them
# ----------------------------------------------------------------------------------------------------
def significant(value: float, digits: int = 2) -> str:
    """``value`` with at most ``digits`` significant digits, in plain notation and without trailing zeros
    (0.3 s stays "0.3", 0.0039 MB "0.0039", 2.84 "2.8", 261.2 "261": a number of at least ``10 ** digits``
    keeps its integer part)."""
    if value is None or not math.isfinite(value):
        return ""
    if value == 0 or abs(value) >= 10 ** digits:
        return f"{value:.0f}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text  # 0.30 -> 0.3


# An integer quantity (a round, a phase, a step) spanning up to this many units gets a tick per unit;
# wider spans keep plotly's automatic ticks, which are integers there.
INTEGER_TICK_SPAN = 10


def integer_ticks(xs: Sequence[float]) -> dict:
    """Axis settings for an axis of counts: one tick per unit when every value is an integer and they span
    at most ``INTEGER_TICK_SPAN`` (plotly would put ticks at halves: "round 1.5"); else automatic ticks."""
    values = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    if values and all(v == round(v) for v in values) and max(values) - min(values) <= INTEGER_TICK_SPAN:
        return {"tickmode": "linear", "tick0": 0, "dtick": 1}
    return {"tickmode": "auto", "tick0": None, "dtick": None}


def _display(obj, **kwargs):
    from IPython.display import display

    return display(obj, **kwargs)


def html_output(text: str):
    """An HTML object for :class:`Updatable` (IPython's ``HTML``)."""
    from IPython.display import HTML

    return HTML(text)


PLOTLY_MIME = "application/vnd.plotly.v1+json"


def mimebundle(obj) -> tuple[dict, dict]:
    """``(data, metadata)``: what ``display(obj)`` would send, without sending it.

    Plotly figures define ``_ipython_display_``, which shows the figure at once (a new output, whatever
    display id or update was asked for): they are asked for their bundle instead.
    """
    if hasattr(obj, "_ipython_display_") and hasattr(obj, "_repr_mimebundle_"):
        out = obj._repr_mimebundle_()
        data, metadata = out if isinstance(out, tuple) else (out, {})
        if isinstance(obj, go.Figure) and PLOTLY_MIME not in data:  # no renderer chosen (not in a kernel)
            data = {**data, PLOTLY_MIME: json.loads(obj.to_json())}
        return data, metadata
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:  # not in IPython: the same formatters, standalone
        from IPython.core.formatters import DisplayFormatter

        return DisplayFormatter().format(obj)
    return shell.display_formatter.format(obj)


class Updatable:
    """One notebook output that the kernel replaces in place: ``Updatable(fig)``, then ``update(fig2)``.

    It is an ordinary output (a plotly figure, HTML), not a widget: what it shows last is saved with the
    notebook and drawn with no kernel. Call it where a visual changes while the kernel runs (training
    curves, an explorer's view); a visual that never changes is simply returned or displayed.
    """

    def __init__(self, obj) -> None:
        data, metadata = mimebundle(obj)
        self._handle = _display(data, raw=True, metadata=metadata, display_id=True)

    def update(self, obj) -> None:
        if self._handle is not None:
            data, metadata = mimebundle(obj)
            self._handle.update(data, raw=True, metadata=metadata)


def show_updatable(obj) -> Updatable:
    """Show ``obj`` (a plotly figure, an IPython HTML...) as an output that ``.update(new)`` replaces."""
    return Updatable(obj)


class Explorer:
    """ipywidgets controls above views that are redrawn whenever a control's value changes.

    Args:
        controls: the widgets (sliders, dropdowns, text boxes); every one with a ``value`` redraws.
        render: returns what the views show: one object or a tuple (plotly figures, ``html_output``...).
        static: what to show where widgets cannot (a terminal, nbval); default: ``render()``.
        text: the current view's numbers as plain text, for a kernel whose frontend cannot draw widgets
            (it shows a bundle's ``text/plain``, which would otherwise be the widget's repr: ``VBox(...)``).

    Shown by IPython (return it from a cell, or ``display`` it) as one box of plain ipywidgets: the
    controls, then one ``Output`` widget per view. The box's state is saved with the notebook when
    JupyterLab saves widget state (``make lab`` turns that on), so a reopened notebook shows the last
    view, without a kernel. ``redraw()`` redraws (for buttons).
    """

    def __init__(self, controls, render, static=None, text=None) -> None:
        self.controls = list(controls)
        self.render = render
        self.static = static
        self.text = text
        self.views: list = []

    def _objects(self) -> tuple:
        out = self.render()
        return out if isinstance(out, tuple) else (out,)

    def redraw(self, *_) -> None:
        for view, obj in zip(self.views, self._objects()):
            data, metadata = mimebundle(obj)
            view.outputs = ({"output_type": "display_data", "data": data, "metadata": metadata},)

    def widget(self):
        """The box of controls and views (built once, drawn with the current values)."""
        import ipywidgets

        if not self.views:
            self.views = [ipywidgets.Output() for _ in self._objects()]
            for control in self.controls:
                if hasattr(control, "value"):
                    control.observe(self.redraw, names="value")
            self.redraw()
        controls = ipywidgets.HBox(self.controls, layout=ipywidgets.Layout(flex_flow="row wrap"))
        return ipywidgets.VBox([controls, *self.views])

    def _ipython_display_(self) -> None:
        if not widgets_available():
            for obj in (self.static() if self.static is not None else self._objects()):
                _display(obj)
            return
        _display(with_text(self.widget(), self.text() if self.text is not None else None))


def with_text(widget, text: str | None):
    """A widget whose plain-text form is ``text`` (numbers a frontend without widgets shows instead of
    the widget's repr), or the widget itself when ``text`` is None."""
    return widget if text is None else _WidgetWithText(widget, text)


class _WidgetWithText:
    def __init__(self, widget, text: str) -> None:
        self.widget, self.text = widget, text

    def _repr_mimebundle_(self, **kwargs) -> dict:
        return {**self.widget._repr_mimebundle_(**kwargs), "text/plain": self.text}

    def __getattr__(self, name: str):  # the widget's own attributes (children, value, ...)
        return getattr(self.widget, name)

    def __repr__(self) -> str:
        return self.text


ROW_GAP_PX = 75  # between two rows of subplots: tick labels, the x title, the next subplot title
X_TITLE_PX = 50  # from the bottom of the lowest plots to below their x titles (where the legend starts)
LEGEND_PX = 40


class LiveDashboard:
    """A grid of line plots, one per panel, fed with ``update(step, **metrics)``.

    Args:
        panels: one entry per subplot: a metric name, or a tuple of names drawn together.
        title: the figure's title.
        titles: subplot titles by panel (the first metric's name); default: the name with spaces.
        smooth: ``{metric: k}`` adds a line of the mean of the last ``k`` points of that metric, and
            draws the raw points faintly (for noisy series such as episodic return).
        cols: subplots per row.
        x_title: label of every x axis.
        refresh_seconds: the shortest time between two redraws of the live figure.
        static: force static (True) or live (False) mode; default: live where widgets can show.
        height_per_row: pixels per row of subplots.

    Metrics that are in no panel are kept in ``history`` but not drawn. NaN and None are gaps.
    """

    def __init__(
        self,
        panels: Sequence[str | Sequence[str]],
        title: str = "",
        *,
        titles: dict[str, str] | None = None,
        smooth: dict[str, int] | None = None,
        cols: int = 3,
        x_title: str = "step",
        refresh_seconds: float = 0.5,
        static: bool | None = None,
        height_per_row: int = 260,
    ) -> None:
        self.panels = [(p,) if isinstance(p, str) else tuple(p) for p in panels]
        self.title = title
        self.smooth = dict(smooth or {})
        self.refresh_seconds = refresh_seconds
        self.history: dict[str, tuple[list[float], list[float]]] = {}
        self.notes: list[str] = []
        self._last_draw = 0.0
        self._finished = False

        titles = titles or {}
        n = len(self.panels)
        self.cols = max(1, min(cols, n))
        rows = math.ceil(n / self.cols)
        # Pixels: each row's plot area, the gap between rows (tick labels, the x title, then the next
        # row's subplot title), and the legend's place under the lowest x titles.
        area = rows * height_per_row
        fig = make_subplots(
            rows=rows,
            cols=self.cols,
            subplot_titles=[titles.get(p[0], " / ".join(m.replace("_", " ") for m in p)) for p in self.panels],
            horizontal_spacing=min(0.3 / self.cols, 0.08),
            vertical_spacing=ROW_GAP_PX / area if rows > 1 else 0.0,
        )
        # One trace per metric (and one more per smoothed metric); remember which trace is which.
        self._trace: dict[str, int] = {}
        self._smooth_trace: dict[str, int] = {}
        palette = pio.templates["rlhf_tutorial"].layout.colorway
        has_legend = False
        for i, panel in enumerate(self.panels):
            row, col = i // self.cols + 1, i % self.cols + 1
            has_legend |= len(panel) > 1
            for j, metric in enumerate(panel):
                colour = palette[j % len(palette)]
                raw_style = dict(mode="markers", marker=dict(size=3, color=colour, opacity=0.35)) \
                    if metric in self.smooth else dict(mode="lines", line=dict(color=colour, width=1.5))
                self._trace[metric] = len(fig.data)
                fig.add_trace(go.Scatter(x=[], y=[], name=metric, showlegend=len(panel) > 1, **raw_style),
                              row=row, col=col)
                if metric in self.smooth:
                    self._smooth_trace[metric] = len(fig.data)
                    fig.add_trace(go.Scatter(x=[], y=[], mode="lines", name=f"{metric} (mean of last {self.smooth[metric]})",
                                             line=dict(color=colour, width=2), showlegend=False),
                                  row=row, col=col)
            if i + self.cols >= n:  # no panel below this one: it carries the x title
                fig.update_xaxes(title_text=x_title, title_standoff=4, row=row, col=col)
        top, bottom = (80 if title else 40), (60 + (LEGEND_PX if has_legend else 0))
        fig.update_layout(
            title=title or None,
            height=area + top + bottom,
            margin=dict(l=60, r=30, t=top, b=bottom),
            legend=dict(orientation="h", yanchor="top", y=-(X_TITLE_PX / area), x=0),
        )
        for annotation in fig.layout.annotations:  # smaller subplot titles
            annotation.font.size = 13

        self.static = (not widgets_available()) if static is None else static
        self.fig = fig
        self._view: Updatable | None = None
        self._notes_view: Updatable | None = None
        if not self.static:
            try:
                self.fig = go.FigureWidget(fig)  # plotly 6+: needs anywidget
            except Exception:  # noqa: BLE001 - no widget support after all: fall back to static
                self.static = True
            else:
                self._view = Updatable(self.fig)

    FEW_POINTS = 5

    # ------------------------------------------------------------------------------------------
    def update(self, step: float | Mapping[str, Any], **metrics: float | None) -> None:
        """Record ``metrics`` at x = ``step``; the live figure redraws at most every refresh_seconds.

        A trainer's per-phase record (a mapping) may be passed alone, so that ``update`` is the trainer's
        ``callback``: x is its ``"phase"`` and the metrics are its entries for the panels' metrics (a missing
        one is a gap)."""
        if isinstance(step, Mapping):
            record = step
            step, metrics = record["phase"], {m: record.get(m) for panel in self.panels for m in panel}
        for name, value in metrics.items():
            value = float("nan") if value is None else float(value)
            xs, ys = self.history.setdefault(name, ([], []))
            xs.append(float(step))
            ys.append(value)
        if not self.static and not self._finished and time.monotonic() - self._last_draw >= self.refresh_seconds:
            self._draw()

    def note(self, text: str) -> None:
        """Show a line of text under the live figure (samples, status); static mode keeps them for finish."""
        self.notes.append(text)
        if not self.static:
            shown = html_output(f"<pre style='white-space:pre-wrap'>{html.escape(text)}</pre>")
            if self._notes_view is None:
                self._notes_view = Updatable(shown)
            else:
                self._notes_view.update(shown)

    def _smoothed(self, ys: list[float], k: int) -> list[float]:
        out, window = [], []
        for y in ys:
            if not math.isnan(y):
                window.append(y)
                window = window[-k:]
            out.append(sum(window) / len(window) if window else float("nan"))
        return out

    def _fill(self, fig: go.Figure) -> None:
        steps: list[float] = []
        for metric, index in self._trace.items():
            xs, ys = self.history.get(metric, ([], []))
            steps += xs
            fig.data[index].x, fig.data[index].y = list(xs), list(ys)
            if metric in self._smooth_trace:
                s = fig.data[self._smooth_trace[metric]]
                s.x, s.y = list(xs), self._smoothed(ys, self.smooth[metric])
            elif fig.data[index].mode == "lines" or fig.data[index].mode == "lines+markers":
                # a line through fewer than FEW_POINTS points shows its points (one point alone has no line)
                fig.data[index].mode = "lines+markers" if len(xs) < self.FEW_POINTS else "lines"
                fig.data[index].marker = dict(size=5)
        fig.update_xaxes(**integer_ticks(steps))  # rounds and phases are counts: no tick at 1.5

    def _draw(self) -> None:
        with self.fig.batch_update():
            self._fill(self.fig)
        self._last_draw = time.monotonic()

    # ------------------------------------------------------------------------------------------
    def to_figure(self) -> go.Figure:
        """A static ``go.Figure`` with everything recorded so far (for saving or showing)."""
        fig = go.Figure(self.fig.to_dict())
        self._fill(fig)
        return fig

    def save(self, path: str) -> str:
        """Write the figure as a self-contained HTML file (plotly.js inlined, so it opens offline)."""
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.to_figure().write_html(path, include_plotlyjs=True)
        return path

    def finish(self) -> None:
        """Draw the final state; in static mode show the figure (once, and only in a kernel).

        Returns nothing, so that ``dash.finish()`` as the last line of a cell does not show the figure a
        second time; ``to_figure()`` gives the figure itself.
        """
        if not self.static:
            if not self._finished:  # the live widget gives way to the static figure, saved with the notebook
                self._view.update(self.to_figure())
                self.fig.close()
                self._finished = True
            return
        if not self._finished and in_kernel():
            _display(self.to_figure())
            if self.notes:
                _display(html_output(f"<pre style='white-space:pre-wrap'>{html.escape(self.notes[-1])}</pre>"))
        self._finished = True
